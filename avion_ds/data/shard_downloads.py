"""How litdata fetches remote shards for ``data.shards``: downloaders registered with litdata's
``register_downloader``, so every transient network error is retried and counted by one policy
(:mod:`avion_ds.data.prep.net_retry`: backoff, one stderr line per retry, :func:`download_retries`), whatever
the scheme.

- ``http://`` / ``https://``: :class:`HttpDownloader`, whole-file GETs over urllib;
- ``s3://``: :class:`CountedS3Downloader`, litdata's own S3 downloader (obstore for shards, boto3 for
  ``index.json``) with its clients' own retries turned off, so that an error reaches the policy: litdata builds
  boto3 with up to 1000 adaptive attempts and obstore with 10, neither of which says that it retried."""

from __future__ import annotations

import http.client
import os
import shutil
import urllib.error
import urllib.request
from typing import Any

from litdata.streaming import downloader as litdata_downloader
from litdata.streaming.client import S3Client
from litdata.streaming.downloader import Downloader, S3Downloader, register_downloader

from avion_ds.data.prep.net_retry import download_retries, retrying


class HttpDownloader(Downloader):
    """litdata downloader for ``http(s)://`` shard locations: one GET per file, published atomically; a
    transient error (5xx, 408, 429, a dropped or short transfer) is retried (:func:`retrying`)."""

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        if os.path.exists(local_filepath):
            return

        def attempt() -> None:
            tmp = self._temp_download_path(local_filepath)
            try:
                _get(remote_filepath, tmp)
                self._atomic_replace(tmp, local_filepath)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)

        retrying(remote_filepath, attempt)


def _get(url: str, dest: str) -> None:
    """``url``'s body into ``dest``; a body shorter than its Content-Length is an error (a dropped transfer)."""
    with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as f:
        shutil.copyfileobj(r, f, 1 << 20)
        want, got = r.headers.get("Content-Length"), f.tell()
    if want is not None and int(want) != got:
        raise http.client.IncompleteRead(b"", int(want) - got)


def _one_attempt() -> Any:
    """boto3's client options with its retries off (litdata's default is 1000 adaptive attempts, uncounted)."""
    import botocore.config  # lazy: boto3 comes with litdata's S3 support

    return botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"})


class CountedS3Downloader(S3Downloader):
    """litdata's ``s3://`` downloader with its clients' retries off and :func:`retrying` around each GET.

    Async prefetch (several shards at once) runs :meth:`download_file` in threads: the async methods are
    litdata's base ones, so litdata's ``downloader_supports_adownload`` sends every GET through here. An
    ``storage_options["config"]`` given to the dataset still wins over the one-attempt boto3 config."""

    adownload_file = Downloader.adownload_file
    adownload_fileobj = Downloader.adownload_fileobj

    def __init__(
        self,
        remote_dir: str,
        cache_dir: str,
        chunks: list[dict[str, Any]],
        storage_options: dict | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(remote_dir, cache_dir, chunks, storage_options, **kwargs)
        options = {"config": _one_attempt(), **self._storage_options}
        self._client = S3Client(storage_options=options, session_options=self.session_options)

    def _get_store(self, bucket: str) -> Any:
        """litdata's obstore store for ``bucket``, rebuilt once per process without obstore's own retries."""
        store = super()._get_store(bucket)
        if store.retry_config is None:  # litdata's: obstore's default 10 silent retries
            from obstore.store import S3Store  # lazy: as litdata, which imports obstore only when it is used

            store = self._store = S3Store(
                config=store.config,
                client_options=store.client_options,
                credential_provider=store.credential_provider,
                retry_config={"max_retries": 0},
            )
        return store

    def download_file(self, remote_filepath: str, local_filepath: str) -> None:
        retrying(
            remote_filepath, lambda: super(CountedS3Downloader, self).download_file(remote_filepath, local_filepath)
        )

    def download_bytes(self, remote_filepath: str, offset: int, length: int, local_chunkpath: str) -> bytes:
        fetch = super().download_bytes
        return retrying(remote_filepath, lambda: fetch(remote_filepath, offset, length, local_chunkpath))


def allow_plain_http_s3() -> None:
    """Let litdata's obstore path reach an S3 endpoint over plain http (``AWS_ENDPOINT_URL[_S3]=http://...``,
    e.g. moto or MinIO on loopback).

    litdata (0.2.76) builds obstore's S3 client with its own ``client_options`` (timeouts, pool) and no
    ``allow_http``; obstore then ignores ``AWS_ALLOW_HTTP`` and refuses the http URL ("HTTP error: builder
    error"). litdata has no public switch for this (``storage_options`` go to boto3, not obstore; the only
    documented way off obstore is not installing it), so this sets ``allow_http`` in litdata's PRIVATE
    ``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``, only for an http endpoint, and does nothing
    when that name is gone. Called at import (spawned workers) and when a shard dataset is built."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    options = getattr(litdata_downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if endpoint.startswith("http://") and isinstance(options, dict):
        options["allow_http"] = True


allow_plain_http_s3()
for _prefix in ("http://", "https://"):
    register_downloader(_prefix, HttpDownloader, overwrite=True)
register_downloader("s3://", CountedS3Downloader, overwrite=True)

__all__ = ["CountedS3Downloader", "HttpDownloader", "allow_plain_http_s3", "download_retries", "retrying"]

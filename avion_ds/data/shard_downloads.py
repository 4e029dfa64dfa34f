"""How litdata fetches remote shards for ``data.shards``: downloaders registered with litdata's
``register_downloader``, so every transient network error is retried and counted by one policy
(:mod:`avion_ds.data.prep.net_retry`: backoff, one stderr line per retry, :func:`download_retries`), whatever
the scheme.

- ``http://`` / ``https://``: :class:`HttpDownloader`, whole-file GETs over urllib;
- ``s3://``: :class:`CountedS3Downloader`, litdata's own S3 downloader (obstore for shards, boto3 for
  ``index.json``) with its clients' own retries turned off, so that an error reaches the policy: litdata builds
  boto3 with up to 1000 adaptive attempts and obstore with 10, neither of which says that it retried.

litdata builds a downloader for every ``Cache``, that is every epoch's iterator and the dataset's opening, and
each would build its own boto3 client (~70 ms of Python, under the GIL) and obstore store before its first
shard. :class:`CountedS3Downloader` shares one of each per process instead, keyed by the options, the
bucket and the ``AWS_*`` environment the clients read (:func:`clear_shared_clients` forgets them).

litdata's prefetch thread downloads a batch of shards at once (all of a small epoch's) and tells the reader
that a shard is there only when the whole batch is done; the reader would wait for the last GET before its
first clip. Our downloaders also say when each shard is on disk (:func:`wait_published`, which
:class:`~avion_ds.data.shards.RowItemLoader` waits on before litdata's own wait), so reading starts with the
first shard. That is an early wake-up only: the reader still checks the file, and litdata's wait decides
whenever the file is not complete."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from litdata.streaming import downloader as litdata_downloader
from litdata.streaming.client import S3Client
from litdata.streaming.downloader import Downloader, S3Downloader, register_downloader

from avion_ds.data.prep.net_retry import download_retries, retrying

_PUBLISHED: dict[str, threading.Event] = {}  # per process: a shard's local path -> set once it is downloaded
_PUBLISHED_LOCK = threading.Lock()
_PUBLISHED_LIMIT = 4096  # entries kept (a reader pops its own); a full table starts afresh


def _published(local_path: str) -> threading.Event:
    """The event set when this process's downloader has finished ``local_path`` (created on first ask)."""
    key = os.path.normpath(local_path)
    with _PUBLISHED_LOCK:
        event = _PUBLISHED.get(key)
        if event is None:
            if len(_PUBLISHED) >= _PUBLISHED_LIMIT:
                _PUBLISHED.clear()
            event = _PUBLISHED[key] = threading.Event()
        return event


def _complete(local_path: str, size: int) -> bool:
    try:
        return os.stat(local_path).st_size >= size
    except OSError:
        return False


def wait_published(local_path: str, size: int, timeout_s: float = 1.0) -> bool:
    """Wait (at most ``timeout_s``) until ``local_path`` holds ``size`` bytes or a downloader of this process
    has finished with it (downloaded, failed, or left it to another process); True when it is complete.

    The file is checked every 50 ms too (another worker's download). Not complete after the wait: the
    caller's own wait (litdata's, with its error and force-download handling) takes over."""
    event = _published(local_path)
    deadline = time.monotonic() + timeout_s
    try:
        while not _complete(local_path, size) and not event.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            event.wait(min(0.05, left))
        return _complete(local_path, size)
    finally:
        with _PUBLISHED_LOCK:
            if _PUBLISHED.get(os.path.normpath(local_path)) is event:
                del _PUBLISHED[os.path.normpath(local_path)]


class _SaysPublished(Downloader):
    """A downloader that sets :func:`_published`'s event of each shard it is done with (see the module doc)."""

    def download_chunk_from_index(self, chunk_index: int) -> None:
        try:
            super().download_chunk_from_index(chunk_index)
        finally:  # a failure too: the reader stops waiting here and litdata's wait reports it
            _published(os.path.join(self._cache_dir, self._chunks[chunk_index]["filename"])).set()


class HttpDownloader(_SaysPublished, Downloader):
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


_SHARED: dict[tuple, Any] = {}  # per process: S3 clients and obstore stores (see the module doc)
_SHARED_LOCK = threading.RLock()
_SHARED_LIMIT = 16  # entries kept; a full cache starts afresh


def _shared(key: tuple, build: Callable[[], Any]) -> Any:
    """This process's object for ``key``, built once (under a lock: concurrent prefetch threads build one)."""
    key = (os.getpid(), *key)  # a forked process builds its own (obstore and boto3 are not fork-safe)
    with _SHARED_LOCK:
        if key not in _SHARED:
            if len(_SHARED) >= _SHARED_LIMIT:
                _SHARED.clear()
            _SHARED[key] = build()
        return _SHARED[key]


def _new_locks_after_fork() -> None:
    """A forked child gets free locks (a parent thread may have held one at the fork)."""
    global _SHARED_LOCK, _PUBLISHED_LOCK
    _SHARED_LOCK, _PUBLISHED_LOCK = threading.RLock(), threading.Lock()


os.register_at_fork(after_in_child=_new_locks_after_fork)


def clear_shared_clients() -> None:
    """Forget the shared S3 clients and stores: the next downloader builds its own, as a new process would."""
    with _SHARED_LOCK:
        _SHARED.clear()


def _options_key(*options: Any) -> str:
    """A stable key for client options (objects such as botocore's ``Config`` by their attributes) and the
    ``AWS_*`` environment boto3 reads (endpoint, credentials, region)."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    obstore = getattr(litdata_downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    attrs = lambda o: [type(o).__name__, vars(o)] if hasattr(o, "__dict__") else repr(o)
    try:
        return json.dumps([options, env, obstore], sort_keys=True, default=attrs)
    except (TypeError, ValueError):  # keys of mixed types, a cycle: a key of its own (nothing shared)
        return repr((options, env, obstore))


class CountedS3Downloader(_SaysPublished, S3Downloader):
    """litdata's ``s3://`` downloader with its clients' retries off and :func:`retrying` around each GET.

    Async prefetch (several shards at once) runs :meth:`download_file` in threads: the async methods are
    litdata's base ones, so litdata's ``downloader_supports_adownload`` sends every GET through here. An
    ``storage_options["config"]`` given to the dataset still wins over the one-attempt boto3 config. The
    boto3 client and obstore store are shared by the process's downloaders (module doc)."""

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
        self._key = _options_key(self._storage_options, self.session_options)
        options = {"config": _one_attempt(), **self._storage_options}
        build = lambda: S3Client(storage_options=options, session_options=self.session_options)
        self._client = _shared(("client", self._key), build)

    def _get_store(self, bucket: str) -> Any:
        """litdata's obstore store for ``bucket``, without obstore's own retries; one per process and key."""
        return _shared(("store", bucket, self._key), lambda: self._build_store(bucket))

    def _build_store(self, bucket: str) -> Any:
        store = super()._get_store(bucket)  # litdata's checks (fork safety) and store
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

__all__ = [
    "CountedS3Downloader",
    "HttpDownloader",
    "allow_plain_http_s3",
    "clear_shared_clients",
    "download_retries",
    "retrying",
    "wait_published",
]

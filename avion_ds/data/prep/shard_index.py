"""What ``avion-ds pack`` records in a shard location's ``index.json`` beyond litdata's own keys, and the
start-up check of a ``data.shards`` location (no litdata needed: start-up runs without it loaded).

The check reads ``index.json`` (a local file, an http(s) GET, or an S3 GET through boto3 with the credentials
and endpoint of the environment, as litdata's own client) and, for a remote location, asks every shard's size
(HEAD requests, a few at a time) against ``index.json``'s ``chunk_bytes``: a missing bucket, prefix or shard,
or a shard copied short, is one line at start-up instead of a failed download mid-epoch. Its requests retry
transient errors as the downloads do (:mod:`avion_ds.data.prep.net_retry`: backoff, counted)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROWS_KEY = "avion_rows"  # per shard entry of index.json: split -> rows of each of its items
ROW_LOADER = "RowItemLoader"  # the item loader litdata must read row-carrying shards with
# the fields pack writes (video_id, meta JSON, chunk bytes): a shard from elsewhere declaring any other
# layout is refused, since litdata's deserializers include pickle (code would run on read)
ITEM_FORMAT = ["str", "str", "bytes"]
REMOTE_PREFIXES = ("http://", "https://", "s3://")
REMOTE_TIMEOUT_S = 30.0  # per request of the start-up check
HEAD_THREADS = 16  # shard sizes asked at once (thousands of shards: seconds, not minutes)


_CHECKED: dict[str, set[str]] = {}  # remote location -> splits it passed the check with in this process


class _Unreachable(Exception):
    """A remote object that cannot be read; the message is the reason in a few words."""


def shard_problem(location: str, splits: tuple[str, ...] = ("train", "val")) -> str | None:
    """One line naming ``data.shards`` when ``location`` has no shards with rows of ``splits`` (a missing
    directory, bucket, prefix or index.json, shards packed without --config) or, remote, a shard that cannot
    be reached or whose size differs from index.json; else None. A remote location that passed is not asked
    again in this process (start-up checks it, then each split's dataset opens it)."""
    if location.startswith(REMOTE_PREFIXES):
        if set(splits) <= _CHECKED.get(location, set()):
            return None
        problem = _remote_problem(location.rstrip("/"), splits)
        if problem is None:
            _CHECKED.setdefault(location, set()).update(splits)
        return problem
    index_path = Path(location) / "index.json"
    if not Path(location).is_dir():
        return f"data.shards: directory not found: {location}"
    if not index_path.is_file():
        return f"data.shards: {location} has no index.json (write shards with `avion-ds pack TREE {location}`)"
    text = index_path.read_text()
    chunks = _chunks(text, str(index_path))
    if isinstance(chunks, str):
        return chunks
    return _rows_problem(chunks, str(index_path), splits) or format_problem(json.loads(text), str(index_path))


def format_problem(index: dict, where: str) -> str | None:
    """Why the item layout ``index`` declares is not pack's (``ITEM_FORMAT``), or None."""
    declared = (index.get("config") or {}).get("data_format")
    if declared != ITEM_FORMAT:
        return (
            f"data.shards: {where} declares data_format={declared!r}, not avion-ds pack's {ITEM_FORMAT!r} "
            "(other layouts are not read: litdata's deserializers can run code)"
        )
    return None


def _chunks(text: str, where: str) -> list[dict] | str:
    """index.json's shard entries, or the one-line problem."""
    try:
        chunks = json.loads(text)["chunks"]
        if not isinstance(chunks, list):
            raise TypeError("'chunks' is not a list")
        return chunks
    except (ValueError, KeyError, TypeError) as e:
        return f"data.shards: {where} is not a litdata index ({type(e).__name__}: {e})"


def _rows_problem(chunks: list[dict], where: str, splits: tuple[str, ...]) -> str | None:
    missing = [s for s in splits if not chunks or any(s not in (c.get(ROWS_KEY) or {}) for c in chunks)]
    if missing:
        return f"data.shards: {where} holds no {'/'.join(missing)} rows (pack with --config RECIPE)"
    return None


def _remote_problem(location: str, splits: tuple[str, ...]) -> str | None:
    """The remote location's index.json and the size of every shard it names."""
    try:
        get, size = _s3_access(location) if location.startswith("s3://") else _http_access()
        text = get(f"{location}/index.json")
    except _Unreachable as e:
        return f"data.shards: {location}/index.json cannot be read ({e})"
    chunks = _chunks(text, f"{location}/index.json")
    if isinstance(chunks, str):
        return chunks
    problem = _rows_problem(chunks, f"{location}/index.json", splits) or format_problem(
        json.loads(text), f"{location}/index.json"
    )
    if problem:
        return problem

    def check(c: dict) -> str | None:
        url = f"{location}/{c['filename']}"
        try:
            got = size(url)
        except _Unreachable as e:
            return f"data.shards: {url} cannot be read ({e})"
        want = c.get("chunk_bytes")
        if isinstance(want, int) and got != want:
            return f"data.shards: {url} is {got} bytes, index.json says {want} (an incomplete copy?)"
        return None

    with ThreadPoolExecutor(min(HEAD_THREADS, max(1, len(chunks)))) as pool:
        return next((p for p in pool.map(check, chunks) if p), None)


def _http_access() -> tuple[Callable[[str], str], Callable[[str], int]]:
    """GET text and HEAD size of http(s) URLs (urllib)."""

    from avion_ds.data.prep.net_retry import retrying  # lazy: local locations need no network policy

    def request(url: str, method: str) -> Any:
        req = urllib.request.Request(url, method=method)
        try:
            return retrying(url, lambda: urllib.request.urlopen(req, timeout=REMOTE_TIMEOUT_S), method)
        except urllib.error.HTTPError as e:
            raise _Unreachable(f"HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError) as e:
            raise _Unreachable(str(getattr(e, "reason", e))) from e

    def get(url: str) -> str:
        with request(url, "GET") as r:
            return r.read().decode()

    def size(url: str) -> int:
        with request(url, "HEAD") as r:
            length = r.headers.get("Content-Length")
        if length is None:
            raise _Unreachable("the server gives no Content-Length")
        return int(length)

    return get, size


def _s3_access(location: str) -> tuple[Callable[[str], str], Callable[[str], int]]:
    """GET text and HEAD size of s3:// URLs through boto3 (credentials, region and endpoint from the
    environment or the AWS config files, as litdata's client reads them)."""
    try:
        import boto3  # lazy: boto3 comes with the [stream] extra and is needed for s3:// locations only
        import botocore.config  # lazy: as boto3
        import botocore.exceptions  # lazy: as boto3
    except ImportError as e:
        raise _Unreachable(f"reading s3:// needs boto3 ({e}); pip install -e '.[stream]'") from e
    from avion_ds.data.prep.net_retry import retrying  # lazy: as boto3

    cfg = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},  # transient errors: retried (and counted) below
        connect_timeout=REMOTE_TIMEOUT_S,
        read_timeout=REMOTE_TIMEOUT_S,
    )
    try:
        client = boto3.session.Session().client("s3", config=cfg)
    except botocore.exceptions.BotoCoreError as e:
        raise _Unreachable(str(e)) from e

    def call(url: str, fn: Callable[..., Any], method: str) -> Any:
        bucket, _, key = url[len("s3://") :].partition("/")
        try:
            return retrying(url, lambda: fn(Bucket=bucket, Key=key), method)
        except botocore.exceptions.ClientError as e:
            err = e.response.get("Error", {})
            code, msg = str(err.get("Code", "")), err.get("Message") or ""
            if code in ("NoSuchBucket",) or "bucket does not exist" in msg.lower():
                raise _Unreachable(f"no bucket {bucket!r}") from e
            if code in ("NoSuchKey", "404", "NotFound"):
                raise _Unreachable("no such object") from e
            raise _Unreachable(f"{code} {msg}".strip()) from e
        except botocore.exceptions.BotoCoreError as e:
            raise _Unreachable(str(e)) from e

    def get(url: str) -> str:
        return call(url, lambda **key: client.get_object(**key)["Body"].read(), "GET").decode()  # a short body: retried

    def size(url: str) -> int:
        return int(call(url, client.head_object, "HEAD")["ContentLength"])

    return get, size

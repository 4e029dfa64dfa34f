"""One retry policy for every remote read of shards (``data.shards`` over http(s):// or s3://): the start-up
check's requests and litdata's downloads (:mod:`avion_ds.data.shard_downloads`). A transient error (a 5xx, 408
or 429 answer, a dropped connection, a timeout, a short body) is retried ``DOWNLOAD_RETRIES`` times with
exponential backoff; each retry is one stderr line (``avion_ds shards: GET URL failed (reason); retry 1 of 4
in 0.5 s``) and one more in :func:`download_retries`. A DataLoader worker counts into its shard dataset's
counters (one slot per worker, in shared memory: :func:`count_into`, the way bad samples are counted), which
the process that built the dataset sums (:func:`add_counter`): forked and spawned workers alike.

No litdata and no torch here: the start-up check runs before either is loaded."""

from __future__ import annotations

import http.client
import os
import sys
import threading
import time
import urllib.error
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
DOWNLOAD_RETRIES = 4  # further attempts of a request after a transient error
DOWNLOAD_BACKOFF_S = 0.5  # first wait; doubled after each failed attempt (0.5, 1, 2, 4 s)
_LOCK = threading.Lock()  # the threads of one process (litdata downloads in a thread of its own)
_OWN: list[int] = [0]  # this process's retries while it counts into no dataset's counters
_COUNTERS: list[Any] = [_OWN]  # what download_retries sums: _OWN, then each shard dataset's worker slots
_SINK: tuple[Any, int] = (_OWN, 0)  # where this process counts: (counters, its slot)
# obstore's errors are one class (GenericError) whose text carries the HTTP status or the connection failure
_TRANSIENT_TEXT = (
    "status code: 5",
    "status code: 408",
    "status code: 429",
    "slow down",
    "timed out",
    "timeout",
    "connection",
    "reset by peer",
    "broken pipe",
    "service unavailable",
)


def download_retries() -> int:
    """Shard requests (http(s):// and s3://) retried so far, in this process and its DataLoader workers."""
    with _LOCK:
        return sum(int(c.sum()) if hasattr(c, "sum") else sum(c) for c in _COUNTERS)


def add_counter(counters: Any) -> None:
    """Sum ``counters`` (a shard dataset's per-worker slots, in shared memory) into :func:`download_retries`."""
    with _LOCK:
        _COUNTERS.append(counters)


def retire_counter(counters: Any) -> None:
    """``counters``' dataset is gone: keep its count in this process's own, and let its shared memory go."""
    global _SINK
    with _LOCK:
        kept = [c for c in _COUNTERS if c is not counters]
        if len(kept) < len(_COUNTERS):
            _OWN[0] += int(counters.sum()) if hasattr(counters, "sum") else sum(counters)
            _COUNTERS[:] = kept
        if _SINK[0] is counters:
            _SINK = (_OWN, 0)


def count_into(counters: Any, slot: int) -> None:
    """Count this process's retries in ``counters[slot]`` from now on (a DataLoader worker: its own slot of its
    dataset's counters, which no other process writes)."""
    global _SINK
    with _LOCK:
        _SINK = (counters, slot)


def _count_one() -> None:
    with _LOCK:
        counters, slot = _SINK
        counters[slot] += 1


def _new_lock() -> None:
    """A forked child's lock: another thread may have held the parent's at the fork."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def transient(e: BaseException) -> bool:
    """Whether a failed request may succeed when repeated: server errors, throttling, dropped connections
    (urllib's, botocore's and obstore's errors); a missing object or a refused credential is not."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code >= 500 or e.code in (408, 429)
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore's ClientError: the HTTP status of the answer
        code = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return code >= 500 or code in (408, 429)
    kind = f"{type(e).__module__}.{type(e).__name__}"
    if kind.startswith(("botocore.", "urllib3.", "s3transfer.")):  # no answer came (connect, read, short body)
        return any(w in kind.lower() for w in ("connection", "timeout", "endpoint", "protocol", "incomplete"))
    if kind.startswith("obstore."):
        return any(w in str(e).lower() for w in _TRANSIENT_TEXT)
    if isinstance(e, (FileNotFoundError, PermissionError)):
        return False
    return isinstance(e, (urllib.error.URLError, OSError, http.client.HTTPException))


def retrying(url: str, attempt: Callable[[], T], method: str = "GET") -> T:
    """``attempt()`` (one request for ``url``), repeated after a transient error ``DOWNLOAD_RETRIES`` times with
    exponential backoff, each retry named on stderr and counted; the last error, or a lasting one, is raised."""
    for n in range(DOWNLOAD_RETRIES + 1):
        try:
            return attempt()
        except Exception as e:
            if n == DOWNLOAD_RETRIES or not transient(e):
                raise
            wait = DOWNLOAD_BACKOFF_S * 2**n
            _count_one()
            text = (str(e).strip().splitlines() or [""])[0]
            print(
                f"avion_ds shards: {method} {url} failed ({type(e).__name__}: {text[:300]}); "
                f"retry {n + 1} of {DOWNLOAD_RETRIES} in {wait:g} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises


__all__ = [
    "DOWNLOAD_BACKOFF_S",
    "DOWNLOAD_RETRIES",
    "add_counter",
    "count_into",
    "download_retries",
    "retire_counter",
    "retrying",
    "transient",
]

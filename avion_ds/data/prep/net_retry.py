"""One retry policy for every remote read of shards (``data.shards`` over http(s):// or s3://): the start-up
check's requests and litdata's downloads (:mod:`avion_ds.data.shard_downloads`). A transient error (a 5xx, 408
or 429 answer, a dropped connection, a timeout, a short body) is retried ``DOWNLOAD_RETRIES`` times with
exponential backoff; each retry is one stderr line (``avion_ds shards: GET URL failed (reason); retry 1 of 4
in 0.5 s``) and one more in a counter shared with forked DataLoader workers (:func:`download_retries`).

No litdata and no torch here: the start-up check runs before either is loaded."""

from __future__ import annotations

import http.client
import multiprocessing
import sys
import time
import urllib.error
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DOWNLOAD_RETRIES = 4  # further attempts of a request after a transient error
DOWNLOAD_BACKOFF_S = 0.5  # first wait; doubled after each failed attempt (0.5, 1, 2, 4 s)
_RETRIED = multiprocessing.Value("q", 0)  # shared memory: forked DataLoader workers add to the same count
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
    """Shard requests (http(s):// and s3://) retried so far, in this process and its forked DataLoader workers."""
    return int(_RETRIED.value)


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
            with _RETRIED.get_lock():
                _RETRIED.value += 1
            text = (str(e).strip().splitlines() or [""])[0]
            print(
                f"avion_ds shards: {method} {url} failed ({type(e).__name__}: {text[:300]}); "
                f"retry {n + 1} of {DOWNLOAD_RETRIES} in {wait:g} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises


__all__ = ["DOWNLOAD_BACKOFF_S", "DOWNLOAD_RETRIES", "download_retries", "retrying", "transient"]

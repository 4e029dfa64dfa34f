"""Servers on loopback for tests and benches: moto's standalone S3-compatible server as a subprocess (ended
with its process tree), a small forwarding proxy that can delay every request or fail a path's first GET
(a transient network error) in front of it, and a static HTTP server of a directory (a thread).

The proxy runs as threads of the calling process (:class:`Proxy`) or as a process of its own
(:func:`proxy_process`: ``python tests/helpers/s3_server.py UPSTREAM --delay-s S``), as a real S3 endpoint is
out of its client's process: a bench then times its reader without the proxy's threads copying every body
under the reader's GIL. The module imports only the standard library at the top, so that process starts
in a blink."""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATS_PATH = "/__proxy__/stats"  # a proxy's counts as JSON (the request is not counted, nor forwarded)
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    """Static files, without a log line per request."""

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_directory(directory: Path, handler: type[http.server.BaseHTTPRequestHandler] = QuietFiles) -> Iterator[str]:
    """``directory`` over HTTP on 127.0.0.1 and a free port (a thread of this process); yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def moto_server(timeout_s: float = 60.0) -> Iterator[str]:
    """``python -m moto.server`` on 127.0.0.1 and a free port; yields its endpoint URL, ends it on exit."""
    from avion_ds.distributed.dist import free_port  # lazy: torch; the proxy process imports this module bare
    from tests.helpers.reaper import kill_tree

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {url} (exit code {proc.poll()})") from None
                time.sleep(0.1)
        yield url
    finally:
        kill_tree(proc.pid)
        proc.wait()


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment litdata's and boto3's S3 clients read: test credentials and ``endpoint``."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


def upload(endpoint: str, bucket: str, prefix: str, folder: Path) -> None:
    """``folder``'s files under s3://bucket/prefix/ (the bucket is created)."""
    import boto3

    env = s3_env(endpoint)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=bucket)
    for p in sorted(folder.iterdir()):
        if p.is_file():
            client.upload_file(str(p), bucket, f"{prefix}/{p.name}")


class Proxy:
    """A threaded HTTP proxy to ``upstream``: ``delay_s`` before every request; with ``fail_first``, the first
    GET of each path ending in one of ``fail_suffixes`` (the shards) is answered 503 (``failed`` counts them)."""

    def __init__(
        self, upstream: str, delay_s: float = 0.0, fail_first: bool = False, fail_suffixes: tuple[str, ...] = (".bin",)
    ) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.delay_s, self.fail_first, self.fail_suffixes = delay_s, fail_first, fail_suffixes
        self.failed, self.requests = 0, 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                proxy.handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Proxy:  # noqa: PYI034 - Python 3.10 has no typing.Self
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def handle(self, req: http.server.BaseHTTPRequestHandler) -> None:
        """Forward one request (body and headers as they are), after the delay; or fail it once."""
        path = req.path.split("?")[0]
        if path == STATS_PATH:
            with self._lock:
                stats = json.dumps({"requests": self.requests, "failed": self.failed}).encode()
            req.send_response(200)
            req.send_header("Content-Length", str(len(stats)))
            req.end_headers()
            req.wfile.write(stats)
            return
        with self._lock:
            self.requests += 1
            shard_get = req.command == "GET" and path.endswith(self.fail_suffixes)
            fail = self.fail_first and shard_get and path not in self._seen
            if shard_get:
                self._seen.add(path)
            self.failed += fail
        if self.delay_s:
            time.sleep(self.delay_s)
        body = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        if fail:
            req.send_response(503, "Slow Down")
            req.send_header("Content-Length", "0")
            req.end_headers()
            return
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            conn.request(req.command, req.path, body=body, headers=dict(req.headers))
            resp = conn.getresponse()
            data = resp.read()
            req.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    req.send_header(k, v)
            length = resp.getheader("Content-Length") if req.command == "HEAD" else None
            req.send_header("Content-Length", length or str(len(data)))
            req.end_headers()
            if req.command != "HEAD":
                req.wfile.write(data)
        finally:
            conn.close()


class ProxyProcess:
    """A :class:`Proxy` running in a process of its own (:func:`proxy_process`): its ``url`` and its counts."""

    def __init__(self, url: str, proc: subprocess.Popen) -> None:
        self.url, self.proc = url, proc

    def stats(self) -> dict[str, int]:
        """The proxy's counts: ``requests`` (all, the failed included) and ``failed``."""
        with urllib.request.urlopen(self.url + STATS_PATH, timeout=10) as r:
            return json.loads(r.read())

    @property
    def requests(self) -> int:
        return self.stats()["requests"]

    @property
    def failed(self) -> int:
        return self.stats()["failed"]


@contextlib.contextmanager
def proxy_process(
    upstream: str, delay_s: float = 0.0, fail_first: bool = False, fail_suffixes: tuple[str, ...] = (".bin",)
) -> Iterator[ProxyProcess]:
    """:class:`Proxy` (same arguments) as a child process on 127.0.0.1 and a free port; ended on exit."""
    from tests.helpers.reaper import kill_tree

    cmd = [sys.executable, __file__, upstream, "--delay-s", str(delay_s), "--fail-suffixes", ",".join(fail_suffixes)]
    proc = subprocess.Popen([*cmd, *(["--fail-first"] if fail_first else [])], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip() if proc.stdout else ""
        if not url.startswith("http://"):
            raise RuntimeError(f"proxy to {upstream} did not start (exit code {proc.poll()})")
        yield ProxyProcess(url, proc)
    finally:
        kill_tree(proc.pid)
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def main(argv: list[str] | None = None) -> None:
    """The proxy process of :func:`proxy_process`: prints its URL on one line, then serves until killed."""
    p = argparse.ArgumentParser(description="a forwarding proxy to an S3 endpoint (tests and benches)")
    p.add_argument("upstream")
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--fail-first", action="store_true")
    p.add_argument("--fail-suffixes", default=".bin")
    a = p.parse_args(argv)
    proxy = Proxy(a.upstream, a.delay_s, a.fail_first, tuple(x for x in a.fail_suffixes.split(",") if x))
    print(proxy.url, flush=True)
    proxy.server.serve_forever()


if __name__ == "__main__":
    main()

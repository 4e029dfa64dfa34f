"""Our litdata downloaders (:mod:`avion_ds.data.shard_downloads`) beyond retries: the reader starts on a shard
as soon as it is downloaded (not when litdata's whole prefetch batch is), the ``s3://`` downloaders of a
process share one boto3 client and one obstore store per key, and the test proxy as a process of its own."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("litdata")

from tests.data.test_shards import _open, packed  # noqa: F401 - the shared packed fixture
from tests.helpers.s3_server import QuietFiles, serve_directory

HOLD_S = 30.0  # how long the held shard's GET waits for the reader before it is served anyway


class _HoldLast(QuietFiles):
    """Static files; the GET of the shard named ``held`` waits until ``release`` is set (or ``HOLD_S``)."""

    held = ""
    release = threading.Event()
    released_by_reader: ClassVar[list[bool]] = []

    def do_GET(self) -> None:
        if self.path.endswith("/" + self.held):
            self.released_by_reader.append(self.release.wait(HOLD_S))
        super().do_GET()


@pytest.fixture()
def holding_http(packed: dict) -> Iterator[str]:  # noqa: F811
    """The shards over HTTP on loopback, the last shard of index.json held back (see :class:`_HoldLast`)."""
    chunks = json.loads((packed["shards"] / "index.json").read_text())["chunks"]
    assert len(chunks) > 1
    _HoldLast.held, _HoldLast.release = chunks[-1]["filename"], threading.Event()
    _HoldLast.released_by_reader = []
    with serve_directory(packed["shards"], _HoldLast) as url:
        yield url
    _HoldLast.release.set()


class _CountWaits:
    """A readiness event of litdata's prefetch thread, counting the reader's waits on it."""

    def __init__(self, event: threading.Event, waits: list[int]) -> None:
        self.event, self.waits = event, waits

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(1)
        return self.event.wait(timeout)

    def clear(self) -> None:
        self.event.clear()


def test_first_shard_is_read_while_the_batch_downloads(
    packed: dict,  # noqa: F811
    holding_http: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """litdata downloads a small epoch's shards in one batch and marks them ready together (its reader waits
    for that, re-checking the file once a second); ours reads a shard as soon as it is on disk: the first clip
    comes while the batch's last shard is held by the server (released only by that first clip), the reader
    never waits on litdata's readiness events, and the clips are the local location's."""
    from litdata.streaming.item_loader import PyTreeLoader

    from avion_ds.data.shards import RowItemLoader

    waits: list[int] = []

    def counting(self: RowItemLoader, provider: Any) -> None:
        PyTreeLoader.set_chunk_ready_provider(self, lambda i: _CountWaits(provider(i), waits))

    monkeypatch.setattr(RowItemLoader, "set_chunk_ready_provider", counting, raising=False)
    ds = _open(packed, "val", holding_http, cache_dir=str(tmp_path))
    seen = []
    for item in ds:
        _HoldLast.release.set()
        seen.append(item["index"])
    assert _HoldLast.released_by_reader == [True]  # released by the first clip, not by the server's timeout
    assert waits == []
    assert sorted(seen) == sorted(item["index"] for item in _open(packed, "val"))


def test_downloader_says_when_it_is_done_with_a_shard(tmp_path: Path) -> None:
    """A shard our downloader has downloaded, or failed to, is published to ``wait_published`` (its event is set:
    a reader stops waiting there, and litdata's own wait reports a failure); ``wait_published`` then answers
    whether the file is complete and forgets the shard."""
    from litdata.streaming.downloader import Downloader

    from avion_ds.data import shard_downloads as sd

    class Fake(sd._SaysPublished, Downloader):
        def download_file(self, remote: str, local: str) -> None:
            if not remote.endswith("good.bin"):
                raise OSError("gone")
            Path(local).write_bytes(b"x" * 10)

    fake = Fake("http://host/p", str(tmp_path), [{"filename": "good.bin"}, {"filename": "bad.bin"}])
    good, bad = str(tmp_path / "good.bin"), str(tmp_path / "bad.bin")
    assert not sd._published(good).is_set()
    fake.download_chunk_from_index(0)
    with pytest.raises(OSError, match="gone"):
        fake.download_chunk_from_index(1)
    assert sd._published(good).is_set() and sd._published(bad).is_set()
    assert sd.wait_published(good, 10, timeout_s=HOLD_S) is True
    assert sd.wait_published(bad, 10, timeout_s=HOLD_S) is False  # published, not there: litdata's wait decides
    assert good not in sd._PUBLISHED and bad not in sd._PUBLISHED


def test_s3_downloaders_share_clients_per_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every ``s3://`` downloader of a process (one per litdata cache: each epoch's iterator) shares the boto3
    client and obstore store of its options and AWS environment; another endpoint or options get their own,
    and ``clear_shared_clients`` forgets them all."""
    from litdata.streaming.downloader import S3Downloader

    from avion_ds.data import shard_downloads as sd

    builds = []

    class Store:
        retry_config: ClassVar[dict] = {"max_retries": 0}

    monkeypatch.setattr(S3Downloader, "_get_store", lambda self, bucket: builds.append(bucket) or Store())
    for k, v in {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
    }.items():
        monkeypatch.setenv(k, v)
    sd.clear_shared_clients()

    def new(**options: Any) -> sd.CountedS3Downloader:
        return sd.CountedS3Downloader("s3://bkt/p", str(tmp_path), [], options)

    a, b = new(), new()
    assert a._client is b._client
    assert a._get_store("bkt") is b._get_store("bkt") and builds == ["bkt"]
    assert a._get_store("other") is not a._get_store("bkt") and builds == ["bkt", "other"]
    assert new(config=None)._client is not a._client  # other options
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")
    assert new()._client is not a._client  # another endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert new()._client is a._client
    sd.clear_shared_clients()
    assert new()._client is not a._client


def test_proxy_process_forwards_delays_and_counts(tmp_path: Path) -> None:
    """``proxy_process`` runs the proxy in a child process: it forwards to its upstream, fails a shard's first
    GET once when asked, and reports its counts."""
    from tests.helpers.s3_server import proxy_process

    (tmp_path / "a.bin").write_bytes(b"shard")
    with serve_directory(tmp_path) as upstream, proxy_process(upstream, delay_s=0.01, fail_first=True) as proxy:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{proxy.url}/a.bin", timeout=30)
        assert e.value.code == 503
        assert urllib.request.urlopen(f"{proxy.url}/a.bin", timeout=30).read() == b"shard"
        assert (proxy.requests, proxy.failed) == (2, 1)
        assert proxy.proc.poll() is None  # a process of its own, serving

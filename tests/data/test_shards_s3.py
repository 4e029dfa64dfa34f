"""Shards from remote locations: ``s3://`` against moto's standalone S3 server (a subprocess on loopback,
credentials and endpoint from the environment only), transient network errors on s3:// (litdata's client
retries) and http(s):// (our downloader retries and counts), and the start-up check of a remote location
(a missing bucket, prefix or shard, a shard of the wrong size: one line)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

pytest.importorskip("litdata")
pytest.importorskip("moto.server")
pytest.importorskip("boto3")

from tests.data.test_shards import _open, packed  # noqa: F401 - the shared packed fixture
from tests.helpers.s3_server import Proxy, moto_server, s3_env, serve_directory, upload

BUCKET, PREFIX = "avion-shards", "epic/shards"


@pytest.fixture(scope="module")
def s3(packed: dict) -> Iterator[str]:  # noqa: F811
    """moto's server with the packed shards under s3://avion-shards/epic/shards; yields its endpoint."""
    with moto_server() as endpoint:
        upload(endpoint, BUCKET, PREFIX, packed["shards"])
        yield endpoint


def _clips(ds: Any) -> dict[int, torch.Tensor]:
    return {item["index"]: item["frames"] for item in ds}


def _same_as_local(packed: dict, remote: dict[int, torch.Tensor]) -> bool:  # noqa: F811
    local = _clips(_open(packed, "val"))
    return remote.keys() == local.keys() and all(torch.equal(remote[i], local[i]) for i in local)


def test_s3_location_streams_the_same_clips(
    packed: dict,  # noqa: F811
    s3: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``data.shards: s3://bucket/prefix`` with credentials and endpoint from the environment only gives the
    local location's clips (litdata's S3 client; obstore over plain http through ``allow_plain_http_s3``)."""
    for k, v in s3_env(s3).items():
        monkeypatch.setenv(k, v)
    remote = _clips(_open(packed, "val", f"s3://{BUCKET}/{PREFIX}", cache_dir=str(tmp_path)))
    assert _same_as_local(packed, remote)
    assert any(p.name.endswith(".bin") for p in tmp_path.rglob("*"))


def test_s3_loader_workers_read_the_local_batches(
    packed: dict,  # noqa: F811
    s3: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the training loader with 2 DataLoader workers (forked; obstore starts in the workers, never
    in the parent), s3:// gives the local location's batches: the same sample ids per step, the same clips. The
    server answers the first GET of every shard with 503: the workers' retries are counted in the parent."""
    from avion_ds.data.loader import build_loader, set_epoch
    from avion_ds.data.prep import net_retry

    monkeypatch.setattr(net_retry, "DOWNLOAD_BACKOFF_S", 0.01)

    def batches(location: str | None, **kw: Any) -> list[tuple[list[int], torch.Tensor]]:
        ds = _open(packed, "train", location, **kw)
        loader = build_loader(ds, 2, 2, shuffle=True, seed=3, drop_last=True, distributed=False)
        set_epoch(loader, 1)
        return [(b["index"].tolist(), b["frames"]) for b in loader]

    before = net_retry.download_retries()
    with Proxy(s3, fail_first=True) as proxy:
        for k, v in s3_env(proxy.url).items():
            monkeypatch.setenv(k, v)
        remote = batches(f"s3://{BUCKET}/{PREFIX}", cache_dir=str(tmp_path))
    assert net_retry.download_retries() - before == proxy.failed == len(list(packed["shards"].glob("*.bin")))
    local = batches(None)
    assert [ids for ids, _ in remote] == [ids for ids, _ in local] and remote
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(remote, local, strict=True))


def test_s3_transient_error_is_retried_and_counted(
    packed: dict,  # noqa: F811
    s3: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
) -> None:
    """A server answering the first GET of index.json and of every shard with 503 still gives the right clips:
    our s3:// downloader (litdata's, with its clients' own retries off) retries each once with backoff, names
    the retry on stderr and counts it, as over http."""
    from avion_ds.data.prep import net_retry

    monkeypatch.setattr(net_retry, "DOWNLOAD_BACKOFF_S", 0.01)
    before = net_retry.download_retries()
    with Proxy(s3, fail_first=True, fail_suffixes=(".bin", "/index.json")) as proxy:
        for k, v in s3_env(proxy.url).items():
            monkeypatch.setenv(k, v)
        remote = _clips(_open(packed, "val", f"s3://{BUCKET}/{PREFIX}", cache_dir=str(tmp_path)))
    n = len(list(packed["shards"].glob("*.bin"))) + 1  # the shards and index.json
    assert proxy.failed == n
    assert net_retry.download_retries() - before == n
    err = capfd.readouterr().err
    assert err.count("retry 1 of 4") == n and f"GET s3://{BUCKET}/{PREFIX}/index.json failed" in err
    assert _same_as_local(packed, remote)


class _FailFirst(http.server.SimpleHTTPRequestHandler):
    """Static files; the first GET of each shard is answered 503 once."""

    seen: ClassVar[set[str]] = set()
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        with self.lock:
            first = self.path.endswith(".bin") and self.path not in self.seen
            self.seen.add(self.path)
        if first:
            self.send_error(503, "try again")
            return
        super().do_GET()


@pytest.fixture()
def flaky_http(packed: dict) -> Iterator[str]:  # noqa: F811
    """The shards over HTTP on loopback, each shard's first GET failing once."""
    _FailFirst.seen = set()
    with serve_directory(packed["shards"], _FailFirst) as url:
        yield url


def test_http_transient_error_is_retried_and_counted(
    packed: dict,  # noqa: F811
    flaky_http: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
) -> None:
    """Our http(s) downloader retries a 503 with backoff, names each retry on stderr and counts it (the count
    outlives the dataset, gone by then: its shared counters are folded into the process's own)."""
    from avion_ds.data.prep import net_retry

    monkeypatch.setattr(net_retry, "DOWNLOAD_BACKOFF_S", 0.01)
    before = net_retry.download_retries()
    remote = _clips(_open(packed, "val", flaky_http, cache_dir=str(tmp_path)))
    n = len(list(packed["shards"].glob("*.bin")))
    assert net_retry.download_retries() - before == n
    assert capfd.readouterr().err.count("retry 1 of 4") == n
    assert _same_as_local(packed, remote)


def test_spawned_worker_retries_are_counted_in_the_parent(
    packed: dict,  # noqa: F811
    flaky_http: str,
    tmp_path: Path,
) -> None:
    """A DataLoader worker started with ``spawn`` (no memory shared by forking) counts its shard download
    retries in its parent's counter: the shard dataset hands it over when the worker unpickles it."""
    from litdata import StreamingDataLoader

    from avion_ds.data.prep import net_retry

    before = net_retry.download_retries()
    ds = _open(packed, "val", flaky_http, cache_dir=str(tmp_path))
    loader = StreamingDataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn")
    ids = [i for b in loader for i in b["index"].tolist()]
    assert sorted(ids) == sorted(_clips(_open(packed, "val")))
    assert net_retry.download_retries() - before == len(list(packed["shards"].glob("*.bin")))


def test_remote_location_problems_are_one_line(
    packed: dict,  # noqa: F811
    s3: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start-up check reads index.json and asks every shard's size: a missing bucket, prefix or shard and
    a shard of another size than index.json's are one line naming the location; good locations pass."""
    import boto3

    from avion_ds.data.prep.shard_index import shard_problem

    for k, v in s3_env(s3).items():
        monkeypatch.setenv(k, v)
    assert shard_problem(f"s3://{BUCKET}/{PREFIX}") is None
    client = boto3.client("s3")
    index = (packed["shards"] / "index.json").read_bytes()
    client.put_object(Bucket=BUCKET, Key="only-index/index.json", Body=index)
    first = min(packed["shards"].glob("*.bin"))
    upload(s3, "short-copy", "s", packed["shards"])
    client.put_object(Bucket="short-copy", Key=f"s/{first.name}", Body=first.read_bytes()[:-10])
    cases = {
        "s3://no-such-bucket/x": ["no bucket 'no-such-bucket'", "index.json"],
        f"s3://{BUCKET}/no/such/prefix": ["s3://avion-shards/no/such/prefix/index.json", "no such object"],
        f"s3://{BUCKET}/only-index": [f"only-index/{first.name} cannot be read", "no such object"],
        "s3://short-copy/s": [f"s3://short-copy/s/{first.name} is {first.stat().st_size - 10} bytes", "index.json"],
    }
    for location, parts in cases.items():
        line = shard_problem(location)
        assert line is not None and line.startswith("data.shards: ") and "\n" not in line, (location, line)
        assert all(p in line for p in parts), (location, line)


@pytest.mark.multiprocess
def test_two_ranks_train_from_s3(packed: dict, s3: str, tmp_path: Path) -> None:  # noqa: F811
    """`avion-ds train` on 2 CPU ranks (torchrun, gloo) with data.shards=s3://... (moto on loopback, credentials
    and endpoint from the environment): 2 steps of global batch 8; each rank read micro-batch x steps training
    samples, the two ranks' disjoint (no DataLoader worker: a worker reads batches ahead of the steps). litdata's
    cache holds an older copy of the location, which both ranks find at start-up (one cleans it up), and the
    server answers the first GET of index.json and of each shard with 503: each is retried once, named in the
    run's output and summed over the ranks in its final line."""
    from tests.helpers.env import engine_env
    from tests.helpers.launch import launch
    from tests.helpers.recipes import losses, write_recipe

    shards = {"shards": f"s3://{BUCKET}/{PREFIX}", "root": "", "train_csv": "", "val_csv": "", "workers": 0}
    run, seen = tmp_path / "run", tmp_path / "samples"
    seen.mkdir()
    recipe = write_recipe(tmp_path / "r.yaml", packed["data"], run, data={"decode_timeout_s": 0.0, **shards})
    args = ["--config", recipe, "--exit-after-steps", "2", "--plugin", "tests.helpers.record_shard_samples"]
    cache = tmp_path / "litdata"  # as the location packed earlier left it: litdata deletes it as both ranks start
    stale = cache / hashlib.md5(shards["shards"].encode()).hexdigest() / "0.5"  # litdata's folder name
    stale.mkdir(parents=True)
    for i in range(20000):
        (stale / f"chunk-0-{i}.bin.cnt").write_text("1")
    with Proxy(s3, fail_first=True, fail_suffixes=(".bin", "/index.json")) as proxy:
        env = engine_env(**s3_env(proxy.url), AVION_TEST_SAMPLES=str(seen), LITDATA_CACHE_DIR=str(cache))
        done = launch(args, nprocs=2, launcher="torchrun", env=env, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert out.count("avion_ds shards: GET s3://") == out.count("retry 1 of 4") == proxy.failed > 1  # each named
    assert f"{proxy.failed} shard download retries" in out  # counted on both ranks, summed in the final line
    assert sorted(losses(run)) == [1, 2]
    ranks = [[int(x) for x in (seen / f"rank{r}.txt").read_text().split()] for r in (0, 1)]
    assert all(len(ids) == len(set(ids)) == 2 * 4 for ids in ranks), ranks  # 2 steps of micro-batch 4
    assert not set(ranks[0]) & set(ranks[1])

"""Clips from litdata shards (``data.shards``): the same clips as the chunk tree gives, every row once per
epoch, an exact mid-epoch resume through litdata's loader state, a loopback HTTP location, and a corrupt
shard named, counted and skipped (or fatal under ``data.on_error: raise``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.helpers.s3_server import serve_directory

pytest.importorskip("litdata")

SEED = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three tiny EPIC-style videos (1 s segments in 2.5 s chunks: some clips span two chunks), a recipe over
    them, and their shards (one video per shard)."""
    from avion_ds.cli.pack import main
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic
    from avion_ds.tasks import load_recipe
    from tests.helpers.recipes import write_recipe

    tmp = tmp_path_factory.mktemp("shards")
    info = make_synthetic_epic(
        tmp / "synth", num_videos=3, segments_per_video=15, segment_seconds=1.0, width=64, height=48, fps=12, seed=1
    )
    summary = chunk_videos(info["videos"], tmp / "chunks", chunk_seconds=2.5, short_side=48, fps=12, progress=False)
    assert not summary.failed, summary
    data = {"root": tmp / "chunks", "train_csv": info["train_csv"], "val_csv": info["val_csv"]}
    recipe_path = write_recipe(tmp / "recipe.yaml", data, tmp / "run", data={"decode_timeout_s": 0.0})
    out = tmp / "shards"
    assert main([str(data["root"]), str(out), "--shard-bytes", "40000", "--config", str(recipe_path)]) == 0
    recipe = load_recipe(recipe_path, [])
    return {"data": data, "recipe": recipe, "recipe_path": recipe_path, "shards": out, "tmp": tmp}


def _open(packed: dict, split: str, location: str | None = None, **kw: Any):
    from avion_ds.data.datasets.build import open_shards

    r = packed["recipe"]
    return open_shards(location or str(packed["shards"]), r.data, split, seed=SEED, sections=r.sections, **kw)


def _reference(packed: dict, split: str, **keys: Any):
    from dataclasses import replace

    from avion_ds.data.datasets.build import build_dataset

    r = packed["recipe"]
    return build_dataset(replace(r.data, **keys), split, seed=SEED, sections=r.sections)


def test_rows_travel_with_the_shards(packed: dict) -> None:
    """Each shard's index entry counts its video's rows per split; the item holds them with the chunks' facts;
    every annotation row is packed once, in the shard of its video, clips spanning two chunks included."""
    from litdata import StreamingDataset

    index = json.loads((packed["shards"] / "index.json").read_text())
    assert index["config"]["item_loader"] == "RowItemLoader"
    counts = {s: sum(sum(c["avion_rows"][s]) for c in index["chunks"]) for s in ("train", "val")}
    ref = {s: _reference(packed, s) for s in ("train", "val")}
    assert counts == {s: len(ds) for s, ds in ref.items()}
    index["config"].pop("item_loader")  # read the video items as they are written
    plain = packed["tmp"] / "plain"
    shutil.copytree(packed["shards"], plain)
    (plain / "index.json").write_text(json.dumps(index))
    spanning = 0
    for item in StreamingDataset(str(plain)):
        meta = json.loads(item["meta"])
        starts = [c["start_frame"] for c in meta["chunks"]]
        for split, ds in ref.items():
            for start, end, label, name, i in meta["rows"][split]:
                entry, s, e, lab = ds.sample_span(i)
                assert (entry.video_id, s, e, lab, ds.row_name(i)) == (item["video_id"], start, end, label, name)
                spanning += any(start < b < end for b in starts)
    assert spanning > 0  # some clips read two consecutive chunks: both are in the item


def test_shard_clips_equal_chunk_tree_clips(packed: dict) -> None:
    """Val clips (fixed) and training clips of an epoch are bit-identical to the chunk tree's for the same row,
    each row exactly once per epoch."""
    for split, epoch in (("val", 0), ("train", 1)):
        ds, ref = _open(packed, split), _reference(packed, split)
        ds.set_clip_epoch(epoch)
        ref.set_epoch(epoch)
        seen = []
        for item in ds:
            i = item["index"]
            seen.append(i)
            want = ref[i]
            assert torch.equal(item["frames"], want["frames"]), (split, i)
            assert item["label"] == want["label"]
        assert sorted(seen) == list(range(len(ref))), split


def _steps(loader: Any, stop: int | None = None) -> list[list[int]]:
    """The sample ids of each batch, ``stop`` batches at most (no batch past them is drawn from the loader)."""
    out, it = [], iter(loader)
    while stop is None or len(out) < stop:
        batch = next(it, None)
        if batch is None:
            break
        out.append(batch["index"].tolist())
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_sees_the_same_samples(packed: dict, workers: int) -> None:
    """A run cut after 5 steps of epoch 1 and resumed from the loader's state_dict (in a fresh dataset and
    loader, as after a restart) reads exactly the sample ids per step of an uninterrupted run."""
    from avion_ds.data.loader import build_loader, set_epoch

    def loader() -> Any:
        return build_loader(
            _open(packed, "train"), 2, workers, shuffle=True, seed=SEED, drop_last=True, distributed=False
        )

    full = loader()
    if workers == 0:  # the epochs' order (once is enough)
        set_epoch(full, 0)
        epoch0 = _steps(full)
    set_epoch(full, 1)
    uninterrupted = _steps(full)
    if workers == 0:
        assert sorted(i for step in uninterrupted for i in step) == sorted(i for step in epoch0 for i in step)
        assert uninterrupted != epoch0  # reshuffled per epoch

    cut = loader()
    set_epoch(cut, 1)
    first = _steps(cut, stop=5)
    state = json.loads(json.dumps(cut.state_dict()))  # as a checkpoint stores it
    resumed = loader()
    resumed.load_state_dict(state)
    set_epoch(resumed, 1)
    rest = _steps(resumed)
    assert first + rest == uninterrupted
    assert resumed.state_dict()["current_epoch"] == state["current_epoch"]  # a later checkpoint names the epoch


@pytest.fixture()
def http_location(packed: dict) -> Iterator[str]:
    """The shards served over HTTP on the loopback interface (a thread of this process)."""
    with serve_directory(packed["shards"]) as url:
        yield url


def test_http_location_streams_the_same_clips(packed: dict, http_location: str, tmp_path: Path) -> None:
    """An http:// location downloads the shards through litdata (our registered downloader) into its cache
    and gives the local location's clips."""
    remote = {item["index"]: item["frames"] for item in _open(packed, "val", http_location, cache_dir=str(tmp_path))}
    local = {item["index"]: item["frames"] for item in _open(packed, "val")}
    assert remote.keys() == local.keys()
    assert all(torch.equal(remote[i], local[i]) for i in local)
    assert any(p.name.endswith(".bin") for p in tmp_path.rglob("*"))  # the shards came through the cache


def _corrupt_copy(packed: dict, dest: Path) -> tuple[str, str]:
    """A copy of the shards with one byte of the first chunk of the first video flipped; (video id, chunk path)."""

    shutil.copytree(packed["shards"], dest)
    return _flip_first_chunk(packed, dest)


def _flip_first_chunk(packed: dict, dest: Path) -> tuple[str, str]:
    """Flip one byte of the first chunk of the first video in the shards at ``dest``, in place."""
    from avion_ds.data.prep.manifest import MANIFEST_NAME, read_manifest_records

    tree = packed["data"]["root"]
    row = min(read_manifest_records(tree / MANIFEST_NAME), key=lambda r: (r["video_id"], r["start_frame"]))
    blob = (tree / row["path"]).read_bytes()
    for shard in sorted(dest.glob("*.bin")):
        raw = bytearray(shard.read_bytes())
        at = raw.find(blob)
        if at >= 0:
            raw[at + len(blob) // 2] ^= 0xFF
            shard.write_bytes(bytes(raw))
            return row["video_id"], row["path"]
    raise AssertionError("chunk bytes not found in any shard")


def test_corrupt_shard_is_named_counted_and_skipped(packed: dict, tmp_path: Path) -> None:
    """Rows reading the damaged chunk are replaced by other rows of the same video (never its frames), the
    error names the location, video and chunk; under data.on_error=raise the first one stops the read."""
    from dataclasses import replace

    from avion_ds.data.errors import DataError

    location = tmp_path / "bad"
    video, chunk = _corrupt_copy(packed, location)
    ds = _open(packed, "train", str(location))
    ref = _reference(packed, "train")
    failed = []
    for item in ds:
        if item["skipped"]:
            failed.append(item["failed_reason"])
        assert torch.equal(item["frames"], ref[item["index"]]["frames"])  # the frames of the row it names
    assert failed and ds.errors >= len(failed)
    assert f"{location}:{video}/{chunk}" in failed[0] and "sha256" in failed[0]

    strict = _open(packed, "train", str(location))
    strict.clips.cfg = replace(strict.clips.cfg, on_error="raise")
    with pytest.raises(DataError, match="sha256"):
        for _ in strict:
            pass


def test_a_shard_file_rewritten_after_a_verified_read_is_hashed_again(
    packed: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk's sha256 is checked once per copy of its shard file in a process: a second epoch over the same
    files hashes nothing; a file rewritten in place (a fresh download, an edit: another mtime) is hashed again,
    and its damage is named."""
    from avion_ds.data import shards

    location = tmp_path / "copy"
    shutil.copytree(packed["shards"], location)
    hashed = []
    real = shards.hashlib.sha256
    monkeypatch.setattr(shards, "hashlib", SimpleNamespace(sha256=lambda b: hashed.append(1) or real(b)))
    assert not any(item["skipped"] for item in _open(packed, "train", str(location)))
    first = len(hashed)
    assert first and not any(item["skipped"] for item in _open(packed, "train", str(location)))
    assert len(hashed) == first  # the same copies: verified already
    video, chunk = _flip_first_chunk(packed, location)
    failed = [item["failed_reason"] for item in _open(packed, "train", str(location)) if item["skipped"]]
    assert failed and f"{location}:{video}/{chunk}" in failed[0] and "sha256" in failed[0]


@pytest.mark.multiprocess  # launches training processes: not in the quick loop
def test_train_from_shards_resumes_mid_epoch_exactly(packed: dict, tmp_path: Path) -> None:
    """`avion-ds train` with data.shards (no chunk tree, no annotation file named): 3 steps uninterrupted, and
    1 step, a checkpoint (holding the shard loader's position), then a resume to step 3: the same losses
    per step, so the same samples in each step (one DataLoader worker)."""
    from tests.helpers.launch import launch
    from tests.helpers.recipes import losses, write_recipe

    shards = {"shards": str(packed["shards"]), "root": "", "train_csv": "", "val_csv": "", "workers": 1}

    def train(run: Path, steps: int) -> None:
        recipe = write_recipe(run.with_suffix(".yaml"), packed["data"], run, data={"decode_timeout_s": 0.0, **shards})
        done = launch(["--config", recipe, "--exit-after-steps", str(steps)], nprocs=1, launcher="python")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(whole, 3)
    train(cut, 1)
    train(cut, 3)
    assert sorted(losses(whole)) == [1, 2, 3]
    assert losses(cut) == losses(whole)


def test_masked_pretraining_clips_from_shards(packed: dict, tmp_path: Path) -> None:
    """The unlabelled videos' dataset (masked pretraining on a folder of videos, the demo's recipe): packed with
    its recipe, the shards give the chunk tree's clips and masks, each clip of each video once per epoch."""
    from dataclasses import replace

    from avion_ds.cli.pack import main
    from avion_ds.data.datasets.build import build_dataset, open_shards
    from avion_ds.tasks import load_recipe
    from avion_ds.tasks.pretrain.task import mask_spec

    recipe_path = Path(__file__).resolve().parents[2] / "launch" / "recipes" / "pretrain_demo_cpu.yaml"
    sets = ["videos.clips_per_video=3", "data.decode_timeout_s=0", f"data.root={packed['data']['root']}"]
    out = tmp_path / "shards"
    argv = [str(packed["data"]["root"]), str(out), "--config", str(recipe_path)]
    assert main(argv + [x for s in sets for x in ("--set", s)]) == 0
    recipe = load_recipe(recipe_path, sets)
    for split, epoch in (("train", 2), ("val", 0)):
        ref = build_dataset(recipe.data, split, seed=SEED, sections=recipe.sections)
        ds = open_shards(str(out), replace(recipe.data, root=""), split, seed=SEED, sections=recipe.sections)
        ref.masks = ds.masks = mask_spec(recipe)
        ref.set_epoch(epoch)
        ds.set_clip_epoch(epoch)
        seen = []
        for item in ds:
            want = ref[item["index"]]
            seen.append(item["index"])
            assert torch.equal(item["frames"], want["frames"]), (split, item["index"])
            assert all(torch.equal(item["label"][k], want["label"][k]) for k in want["label"]), split
        assert sorted(seen) == list(range(len(ref))), split


def test_truncated_shard_is_named_counted_and_skipped(packed: dict, tmp_path: Path) -> None:
    """A shard cut short (a partial copy): each of its rows is replaced by a row read before it, counted, and
    the reason names the shard file; under data.on_error=raise the read stops naming it."""
    from dataclasses import replace

    from avion_ds.data.errors import DataError

    location = tmp_path / "cut"
    shutil.copytree(packed["shards"], location)
    index = json.loads((location / "index.json").read_text())
    last = index["chunks"][-1]
    shard = location / last["filename"]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    ds = _open(packed, "train", str(location), shuffle=False)  # shard order as written: the cut one last
    items = list(ds)
    assert len(items) == len(_reference(packed, "train"))
    failed = [it["failed_reason"] for it in items if it["skipped"]]
    assert len(failed) == sum(last["avion_rows"]["train"]) == ds.errors
    assert all(f"{location}/{last['filename']}: shard cannot be read" in f for f in failed), failed[0]

    strict = _open(packed, "train", str(location), shuffle=False)
    strict.clips.cfg = replace(strict.clips.cfg, on_error="raise")
    with pytest.raises(DataError, match=last["filename"]):
        for _ in strict:
            pass


def _lockstep(per_rank: list[list[list[int]]]) -> list[int]:
    """The sample ids ranks read, step by step (rank 0's batch, rank 1's, ...): the order a run reads its epoch."""
    return [i for step in zip(*per_rank, strict=True) for batch in step for i in batch]


def _ranks(
    packed: dict, monkeypatch: pytest.MonkeyPatch, world: int, workers: int, state: dict | None = None, stop: int = 0
) -> tuple[list[list[list[int]]], list[dict]]:
    """Epoch 1 on ``world`` ranks (faked through litdata's WORLD_SIZE / GLOBAL_RANK, one loader per rank),
    from ``state`` when given, ``stop`` steps at most (0: all): (each rank's batches, its loader state after)."""
    from avion_ds.data.loader import build_loader, set_epoch

    batches, states = [], []
    for rank in range(world):
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("GLOBAL_RANK", str(rank))
        ds = _open(packed, "train")
        loader = build_loader(ds, 2, workers, shuffle=True, seed=SEED, drop_last=True, distributed=False)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
        set_epoch(loader, 1)
        batches.append(_steps(loader, stop or None))
        states.append(json.loads(json.dumps(loader.state_dict())))
    return batches, states


@pytest.mark.parametrize(
    ("before", "after", "workers", "stops"), [(1, 2, 0, (1, 2, 3, 5)), (2, 1, 0, (1, 2, 3, 5)), (1, 2, 2, (1, 2))]
)
def test_a_world_change_resumes_exactly(
    packed: dict, monkeypatch: pytest.MonkeyPatch, before: int, after: int, workers: int, stops: tuple[int, ...]
) -> None:
    """Exact resume on another number of ranks: an epoch's samples in the order the first world reads them
    (ranks' batches step by step); a run cut after k steps and resumed on the new world reads that order's first
    k x world x batch samples, then the ones after, each once: no sample twice, none skipped, and only the
    epoch's last samples that fill no whole batch of every new rank and worker (fewer than new ranks x workers x
    batch) fall to drop_last, as in any epoch (none when they divide: then the same multiset as the uninterrupted
    run). Ranks read disjoint rows, as many batches each. Cut at several points, some not at a whole batch of
    the new world (litdata alone reads the remainder twice); with 2 DataLoader workers per rank too."""
    whole, _ = _ranks(packed, monkeypatch, before, workers)
    order = _lockstep(whole)
    assert len(order) == len(set(order)) > 0
    fresh, _ = _ranks(packed, monkeypatch, after, workers)  # the new world's own epoch: disjoint, equal steps
    assert len({len(b) for b in fresh}) == 1 and len(set(_lockstep(fresh))) == len(_lockstep(fresh))
    stride, divides = after * max(workers, 1) * 2, 0  # the samples of one batch of every new rank and worker
    for stop in stops:
        cut, states = _ranks(packed, monkeypatch, before, workers, stop=stop)
        assert all(s == states[0] for s in states)  # every rank saves the same position
        rest, _ = _ranks(packed, monkeypatch, after, workers, state=states[0])
        assert len({len(b) for b in rest}) == 1  # the new ranks step together
        seen = _lockstep(cut) + _lockstep(rest)
        assert seen == order[: len(seen)], stop  # each once, in the first world's order, nothing skipped
        assert len(seen) == len(set(seen))
        left = len(order) - stop * before * 2
        assert len(order) - len(seen) == left % stride, stop  # only drop_last's tail of the new world
        divides += left % stride == 0
        if left % stride == 0:
            assert sorted(seen) == sorted(order)  # the uninterrupted run's samples exactly
    assert divides > 0


def test_kinetics_list_clips_from_shards(packed: dict, tmp_path: Path) -> None:
    """A Kinetics-style dataset (VideoMAE ``path label`` lists, stride sampling) packs and reads the same way:
    the shards give the chunk tree's clips and labels."""
    from avion_ds.cli.pack import main
    from avion_ds.tasks import load_recipe
    from tests.helpers.recipes import write_recipe
    from tests.helpers.shard_checks import assert_shards_give_tree_clips

    videos = sorted(p.name for p in Path(packed["data"]["root"]).iterdir() if p.is_dir())
    lists = {}
    for split in ("train", "val"):
        lists[split] = tmp_path / f"{split}.txt"
        lists[split].write_text("".join(f"{v}.mp4 {k % 2}\n" for k, v in enumerate(videos)))
    keys = {"dataset": "kinetics", "sampling": "stride", "stride": 2, "decode_timeout_s": 0.0}
    data = {**packed["data"], "train_csv": lists["train"], "val_csv": lists["val"]}
    recipe_path = write_recipe(tmp_path / "k.yaml", data, tmp_path / "run", data=keys, model={"heads": None})
    out = tmp_path / "shards"
    assert main([str(data["root"]), str(out), "--config", str(recipe_path)]) == 0
    sizes = assert_shards_give_tree_clips(out, load_recipe(recipe_path, []), seed=SEED)
    assert sizes == {"train": len(videos), "val": len(videos)}


def _micro_order(ids: dict[int, list[int]], micro: int = 4) -> list[int]:
    """Ranks' recorded samples as the run read them: micro-batch by micro-batch, rank 0's, then rank 1's."""
    return [i for k in range(0, len(ids[0]), micro) for r in sorted(ids) for i in ids[r][k : k + micro]]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_training_resumed_on_another_world_reads_the_uninterrupted_order(
    packed: dict, tmp_path: Path, before: int, after: int
) -> None:
    """`avion-ds train` from shards (ZeRO-2, global batch 8 of micro-batches of 4: accum 2 on 1 rank, 1 on 2),
    killed after step 1 (its checkpoint) and resumed on the other number of ranks (elastic resume): steps 2 and
    3 read exactly the samples the uninterrupted run read in them, in its order, and none of step 1. On 2
    torchrun ranks the two read disjoint samples, as many each (the dataset is built before the process group
    exists, when litdata sees WORLD_SIZE but no rank: the loader asks the group)."""
    from tests.helpers import REPO
    from tests.helpers.env import engine_env
    from tests.helpers.launch import launch
    from tests.helpers.recipes import cut_run_at, losses, write_recipe

    shards = {"shards": str(packed["shards"]), "root": "", "train_csv": "", "val_csv": "", "workers": 0}
    keys = {"data": {"decode_timeout_s": 0.0, "hflip": 0.0, **shards}, "checkpoint": {"every_steps": 1, "keep_last": 5}}

    def train(run: Path, ranks: int) -> tuple[list[int], str]:
        seen = tmp_path / f"{run.name}_samples"
        seen.mkdir()
        recipe = write_recipe(tmp_path / f"{run.name}.yaml", packed["data"], run, **keys)
        args = ["--config", recipe, "--deepspeed_config", REPO / "ds_configs" / "zero2.json"]
        args += ["--exit-after-steps", "3", "--plugin", "tests.helpers.record_shard_samples"]
        done = launch(args, nprocs=ranks, env=engine_env(AVION_TEST_SAMPLES=str(seen)), timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ids = {r: [int(x) for x in (seen / f"rank{r}.txt").read_text().split()] for r in range(ranks)}
        if ranks == 2:
            assert len(ids[0]) == len(ids[1]) > 0 and not set(ids[0]) & set(ids[1]), ids
        return _micro_order(ids), done.stdout + done.stderr

    whole, _ = train(tmp_path / "whole", before)
    assert sorted(losses(tmp_path / "whole")) == [1, 2, 3] and len(whole) == len(set(whole)) == 3 * 8
    cut_run_at(tmp_path / "whole", tmp_path / "cut", 1)
    resumed, log = train(tmp_path / "cut", after)
    assert f"elastic resume: step_00000001 was written by {before} ranks, this run has {after}" in log
    assert sorted(losses(tmp_path / "cut")) == [2, 3]
    assert resumed == whole[8:]  # steps 2 and 3, in the uninterrupted run's order: none of step 1 again


@pytest.mark.multiprocess
def test_a_run_killed_with_sigkill_resumes_the_uninterrupted_samples(packed: dict, tmp_path: Path) -> None:
    """`avion-ds train` from shards (one process, no DataLoader worker, a checkpoint every step) killed with
    SIGKILL at two points of the epoch (its checkpoint of step 1, then of step 2, complete, and held before the
    next step's first read: ``AVION_TEST_HOLD_AT``) and started again with the same command: the steps after the
    checkpoint it resumed from read exactly the samples the uninterrupted run read in them, in its order."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import REPO
    from tests.helpers.env import engine_env
    from tests.helpers.launch import launch
    from tests.helpers.recipes import losses, write_recipe

    shards = {"shards": str(packed["shards"]), "root": "", "train_csv": "", "val_csv": "", "workers": 0}
    keys = {"data": {"decode_timeout_s": 0.0, "hflip": 0.0, **shards}, "checkpoint": {"every_steps": 1, "keep_last": 5}}
    plugin = ["--exit-after-steps", "3", "--plugin", "tests.helpers.record_shard_samples"]

    def setup(name: str) -> tuple[list[str], dict[str, str], Path, Path]:
        run, seen = tmp_path / name, tmp_path / f"{name}_samples"
        seen.mkdir()
        recipe = write_recipe(tmp_path / f"{name}.yaml", packed["data"], run, **keys)
        return ["--config", str(recipe), *plugin], engine_env(AVION_TEST_SAMPLES=str(seen)), run, seen

    args, env, run, seen = setup("whole")
    done = launch(args, nprocs=1, launcher="python", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    whole = [int(x) for x in (seen / "rank0.txt").read_text().split()]
    assert sorted(losses(run)) == [1, 2, 3] and len(whole) == len(set(whole)) == 3 * 8
    for k in (1, 2):
        args, env, run, seen = setup(f"killed{k}")
        cmd = [sys.executable, str(REPO / "launch" / "train.py"), *args]
        held = {**env, "AVION_TEST_HOLD_AT": str(k * 8)}  # no step after k: the kill lands after checkpoint k
        proc = subprocess.Popen(cmd, cwd=REPO, env=held, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        marker, deadline = run / "checkpoints" / f"step_{k:08d}" / "COMPLETE.json", time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists() and proc.poll() is None, f"step {k}'s checkpoint never completed (rc {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        (seen / "rank0.txt").unlink()  # what the killed run read; the relaunch records its own reads
        done = launch(args, nprocs=1, launcher="python", env=env, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        resumed_at = next(
            int(line.split("step_")[1][:8])
            for line in (done.stdout + done.stderr).splitlines()
            if "resumed from" in line
        )
        assert resumed_at == k
        resumed = [int(x) for x in (seen / "rank0.txt").read_text().split()]
        assert resumed == whole[k * 8 :], (k, resumed)

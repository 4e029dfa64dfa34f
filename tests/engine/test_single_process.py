"""A plain `python launch/train.py` (one process, no launcher) and the non-finite `stop` policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, engine_env, write_recipe

pytestmark = pytest.mark.multiprocess


def test_nonfinite_stop_exits_nonzero_with_step(tiny_epic: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    # lr 1e30 without clipping: the first AdamW step blows the weights up, step 2's loss is not finite
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_epic, run, optim={"lr": 1e30, "clip_grad": 0.0}, checkpoint={"every_steps": 0}
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch" / "train.py"),
            "--config",
            str(recipe),
            "--deepspeed_config",
            str(REPO / "ds_configs" / "zero0.json"),
            "--set",
            "nonfinite=stop",
            "--set",
            "batch.global_batch=4",
        ],
        cwd=REPO,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    err = proc.stderr
    assert proc.returncode == 3, (proc.stdout + err)[-3000:]
    assert "avion-ds train: error: non-finite loss at global step 2 (epoch 0, step 2 of the epoch)" in err
    assert "world 1 | ZeRO-0" in proc.stdout
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").glob("step_*"))


def truncate_one_video(tiny_epic: dict, tmp_path: Path) -> tuple[dict, list[Path]]:
    """A copy of the chunks where every chunk of one video is cut to its first 3000 bytes (no moov atom)."""
    import shutil

    chunks = tmp_path / "chunks"
    shutil.copytree(tiny_epic["root"], chunks)
    victim = min(p for p in chunks.iterdir() if p.is_dir())
    files = sorted(victim.glob("*.mp4"))
    for f in files:
        f.write_bytes(f.read_bytes()[:3000])
    # the manifest describes the files as they are now (a bad encode, not a later change), so they
    # reach the decoder instead of failing the manifest's size/mtime check
    rows = [json.loads(x) for x in (chunks / "manifest.jsonl").read_text().splitlines() if x.strip()]
    for r in rows:
        path = chunks / r["path"]
        if path in files:
            r.update(bytes=path.stat().st_size, mtime_ns=path.stat().st_mtime_ns)
    (chunks / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {**tiny_epic, "root": chunks}, files


def test_bad_videos_are_skipped_counted_and_named_once(tiny_epic: dict, tmp_path: Path) -> None:
    """Every chunk of one video is truncated: training goes on over 2 epochs with 2 loader workers,
    reports the count, names each bad file exactly once, and the decoders' own stderr stays out."""

    data, files = truncate_one_video(tiny_epic, tmp_path)
    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        data,
        run,
        data={"workers": 2},
        schedule={"epochs": 2, "steps_per_epoch": 4},
        checkpoint={"every_steps": 0},
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch" / "train.py"),
            "--config",
            str(recipe),
            "--deepspeed_config",
            str(REPO / "ds_configs" / "zero0.json"),
        ],
        cwd=REPO,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    bad = [r["bad_samples"] for r in rows if "bad_samples" in r]
    assert bad and bad[-1] > 0 and bad == sorted(bad)
    named = {f: sum(str(f) in line for line in out.splitlines()) for f in files}
    assert any(named.values()), out[-3000:]  # the skipped files are named in the log ...
    assert all("could not decode" in line for line in out.splitlines() if any(str(f) in line for f in files))
    assert set(named.values()) <= {0, 1}, named  # ... each at most once per run
    assert bad[-1] > sum(named.values())  # the repeats are counted, not named
    assert f"{bad[-1]} bad input samples skipped" in out
    assert "moov atom" not in out and "ERROR opening" not in out  # decoder stderr kept out of the log


def _train_proc(
    recipe: Path, *extra: str, ds: str = "zero0.json", timeout: int = 240, prefix: list[str] | None = None
) -> subprocess.CompletedProcess:
    cmd = prefix or [sys.executable, str(REPO / "launch" / "train.py")]
    return subprocess.run(
        [*cmd, "--config", str(recipe), "--deepspeed_config", str(REPO / "ds_configs" / ds), *extra],
        cwd=REPO,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bad_input_end_to_end_is_one_stderr_line_exit_2(tiny_epic: dict, tmp_path: Path) -> None:
    """The console command, not the in-process table: exit status and the whole of stderr."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_epic, tmp_path / "run")
    proc = _train_proc(recipe, "--set", "optim.lr=.inf", prefix=[sys.executable, "-m", "avion_ds.cli", "train"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == ["avion-ds train: error: optim.lr=inf is not a finite number"]
    assert not (tmp_path / "run").exists()  # nothing was created


def test_unexpected_error_in_a_step_exits_1_with_traceback(tiny_epic: dict, tmp_path: Path) -> None:
    """No blanket except: a bug inside a training step is a failure (1) with its traceback, not 'bad input'."""
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_epic,
        tmp_path / "run",
        schedule={"epochs": 1, "steps_per_epoch": 3},
        checkpoint={"every_steps": 0},
    )
    script = (
        "import sys\nimport avion_ds.cli.train as train\nfrom avion_ds.tasks import register_task\n"
        "from avion_ds.tasks.finetune.task import FinetuneTask\ncalls = []\n"
        "@register_task\nclass Broken(FinetuneTask):\n    name = 'finetune_broken'\n"
        "    def loss(self, *a, **k):\n        calls.append(1)\n        if len(calls) == 2:\n"
        "            raise ValueError('injected bug in step 2')\n        return super().loss(*a, **k)\n"
        "sys.exit(train.main([*sys.argv[1:], '--set', 'task=finetune_broken']))\n"
    )
    proc = _train_proc(recipe, prefix=[sys.executable, "-c", script])
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert "Traceback (most recent call last)" in proc.stderr and "ValueError: injected bug in step 2" in proc.stderr
    assert "error: injected" not in proc.stderr  # not reported as a user error


def test_nonfinite_streak_stops_with_exit_3(tiny_epic: dict, tmp_path: Path) -> None:
    """Under `nonfinite: skip`, a run whose every loss is non-finite stops after the cap (was: exit 0)."""
    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_epic,
        run,
        optim={"lr": 1e30, "clip_grad": 0.0},
        schedule={"epochs": 1},
        checkpoint={"every_steps": 0},
    )
    proc = _train_proc(recipe, "--set", "nonfinite_max_consecutive=2", "--set", "batch.global_batch=4")
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:]
    assert "error: 2 non-finite micro-batches in a row (nonfinite_max_consecutive=2)" in proc.stderr
    assert not list(run.glob("checkpoints/step_*"))


def test_checkpoint_with_nonfinite_weights_is_never_written(tiny_epic: dict, tmp_path: Path) -> None:
    """A weight turned NaN during step 2 (after its loss was computed): step 1 is saved, step 2 is refused."""
    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_epic,
        run,
        schedule={"epochs": 1, "steps_per_epoch": 3},
        checkpoint={"every_steps": 1, "keep_last": 5},
    )
    script = (
        "import sys, torch\nimport avion_ds.cli.train as train\nfrom avion_ds.tasks import register_task\n"
        "from avion_ds.tasks.finetune.task import FinetuneTask\n"
        "@register_task\nclass Poison(FinetuneTask):\n    name = 'finetune_poisoned_weight'\n"
        "    def __init__(self):\n        self.calls = 0\n"
        "    def loss(self, model, *a, **k):\n        self.calls += 1\n        if self.calls == 2:\n"
        "            with torch.no_grad():\n                next(model.module.parameters()).view(-1)[0] = float('nan')\n"
        "        return super().loss(model, *a, **k)\n"
        "sys.exit(train.main([*sys.argv[1:], '--set', 'task=finetune_poisoned_weight']))\n"
    )
    proc = _train_proc(recipe, "--set", "batch.global_batch=4", prefix=[sys.executable, "-c", script])
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:]
    assert "error: non-finite weights at global step 2: checkpoint step_00000002 not written" in proc.stderr
    assert sorted(p.name for p in run.glob("checkpoints/step_*")) == ["step_00000001"]


def test_resume_from_tag_rewrites_history(tiny_epic: dict, tmp_path: Path) -> None:
    """--resume-from an older tag: the rows past it are dropped from history.jsonl (no replayed
    duplicates) and the replayed step's loss equals the first run's."""

    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_epic,
        run,
        schedule={"epochs": 1, "steps_per_epoch": 4},
        checkpoint={"every_steps": 1, "keep_last": 5},
    )
    first = _train_proc(recipe, "--set", "batch.global_batch=4", "--exit-after-steps", "3")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    before = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in before] == [1, 2, 3]
    second = _train_proc(
        recipe, "--set", "batch.global_batch=4", "--exit-after-steps", "2", "--resume-from", "step_00000001"
    )
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "resumed from step_00000001: epoch 0, step 1 in epoch, global step 1" in second.stdout
    after = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in after] == [1, 2]  # step 3 of the first run is gone, step 2 written once
    assert after[1]["loss"] == pytest.approx(before[1]["loss"], abs=1e-6)

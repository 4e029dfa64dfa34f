"""A task is one folder: a package written into tmp_path, outside avion_ds, with its own recipe section
(``toy_loss.weight``), its own loss (a section-weighted Brier score, not cross-entropy), its own metrics
(``toy_acc``, ``toy_brier``, computed in its ``evaluate`` and printed by its ``eval_line``) and its own
dataset (``toy_json_clips``: a JSON list of {"clip", "class"} rows over a few tiny generated videos),
trained 2 optimizer steps on one CPU rank with ``avion-ds train --plugin toy_pkg``, then evaluated with
``avion-ds eval --plugin toy_pkg``, exported and checked; no file of avion_ds is edited and avion_ds never
names the task, its section or its dataset.

This is the worked example of docs/design.md, "Adding a task".
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, engine_env, run_process

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "avion_ds.cli"]
NAMES = ("toy_pkg", "toy_brier_task", "toy_json_clips", "toy_loss")  # none of them appears in avion_ds

SECTION = '''"""The task's own recipe section: ``toy_loss.weight`` scales the loss."""
from dataclasses import dataclass

from avion_ds.config import register_section


@dataclass
class ToyLossConfig:
    weight: float = 1.0


register_section("toy_loss", ToyLossConfig, ranges={"weight": (0.0, 10.0, False, True)})
'''

DATASET = '''"""The task's own dataset: ``data.train_csv`` / ``data.val_csv`` name a JSON list of
{"clip": path under data.root, "class": int} rows."""
import json
from pathlib import Path

from avion_ds.data.datasets.registry import register_dataset
from avion_ds.data.datasets.video_clips import VideoClipDataset
from avion_ds.data.datasets.csv_rows import split_csv


def read_rows(path):
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty JSON list of {{clip, class}} rows")
    return rows


@register_dataset
class ToyJsonClips(VideoClipDataset):
    dataset_name = "toy_json_clips"

    @staticmethod
    def annotation_summary(cfg, split):
        rows = read_rows(split_csv(cfg, split))
        return len(rows), 1 + max(int(r["class"]) for r in rows)

    def __init__(self, cfg, split, temporal_views=1, spatial_views=1, seed=0, index=None):
        super().__init__(cfg, split, temporal_views, spatial_views, seed, index)
        self.list_path = Path(self._split_file())
        self.rows = read_rows(self.list_path)
        self.num_classes = 1 + max(int(r["class"]) for r in self.rows)
        self._prune()

    def __len__(self):
        return len(self.rows)

    def row_ref(self, i):
        return self.rows[i]["clip"], True

    def row_where(self, i):
        return self.list_path, i + 1

    def row_name(self, i):
        return self.rows[i]["clip"]

    def sample_span(self, i):
        entry = self.index.by_path(self.rows[i]["clip"])
        return entry, 0, entry.num_frames, int(self.rows[i]["class"])
'''

TASK = '''"""The task: a fine-tuning model, its own loss (toy_loss.weight x Brier score) and metrics."""
import torch
import torch.nn.functional as F

from avion_ds.tasks import EvalOutcome, register_task
from avion_ds.tasks.common.evaluation import evaluate_model
from avion_ds.tasks.finetune import FinetuneTask


def brier(probs, targets):
    """Mean squared distance of class probabilities to the one-hot (or soft) targets."""
    if not targets.is_floating_point():
        targets = F.one_hot(targets.long(), probs.shape[-1]).float()
    return ((probs.float() - targets) ** 2).sum(-1).mean()


@register_task
class ToyBrierTask(FinetuneTask):
    name = "toy_brier_task"

    def loss(self, model, x, targets, dtype, recipe):
        weight = recipe.toy_loss.weight
        score = brier(model(x.to(dtype)).float().softmax(-1), targets)
        return weight * score, {"toy_brier": score.detach(), "toy_weight": torch.tensor(weight)}

    def evaluate(self, ctx):
        _, (index, probs, labels), failed = evaluate_model(ctx)
        metrics = {
            "toy_acc": 100.0 * (probs.argmax(-1) == labels).float().mean().item(),
            "toy_brier": brier(probs, labels).item(),
        }
        return EvalOutcome(metrics, None, failed, None, int(index.numel()))

    def eval_line(self, metrics, report=None):
        return f"toy task: toy_acc={metrics['toy_acc']:.1f} toy_brier={metrics['toy_brier']:.4f}"
'''

INIT = '''"""A task of another package: section, dataset and task register on import."""
from toy_pkg import dataset, section, task  # noqa: F401
'''


def tree_hash(root: Path) -> str:
    """sha256 over the relative paths and bytes of every file under ``root`` but byte-code caches."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def write_plugin(pkg: Path) -> None:
    """The toy package: one folder with its section, dataset and task."""
    pkg.mkdir(parents=True)
    for name, text in {"__init__": INIT, "section": SECTION, "dataset": DATASET, "task": TASK}.items():
        (pkg / f"{name}.py").write_text(text)


def write_data(root: Path) -> dict[str, Path]:
    """Six 16-frame 32x32 videos (the project's test-video writer) and train / val JSON lists over them."""
    from avion_ds.data.prep.synthetic import write_video

    videos = root / "videos"
    for k in range(6):
        write_video(videos / f"clip{k}.mp4", 16, 32, 32, fps=8, pattern=("testsrc", "gray", "noise")[k % 3])
    rows = [{"clip": f"clip{k}.mp4", "class": k % 3} for k in range(6)]
    (root / "train.json").write_text(json.dumps(rows[:4]))
    (root / "val.json").write_text(json.dumps(rows[3:]))
    return {"root": videos, "train": root / "train.json", "val": root / "val.json"}


def write_toy_recipe(path: Path, data: dict[str, Path], run: Path) -> Path:
    """vit_test_tiny, 3 classes, 4 frames of 32x32, fp32, 2 optimizer steps of 2 clips, the task's section."""
    recipe = {
        "task": "toy_brier_task",
        "toy_loss": {"weight": 0.25},
        "model": {"name": "vit_test_tiny", "num_classes": 3},
        "data": {
            "dataset": "toy_json_clips",
            "root": str(data["root"]),
            "train_csv": str(data["train"]),
            "val_csv": str(data["val"]),
            "chunked": False,
            "num_frames": 4,
            "size": 32,
            "workers": 0,
            "decoder": "pyav",
            "decode_timeout_s": 0.0,
        },
        "optim": {"lr": 1e-3, "base_batch": 2},
        "schedule": {"epochs": 1, "steps_per_epoch": 2, "warmup_epochs": 0},
        "batch": {"global_batch": 2, "micro_batch": 2},
        "eval": {"every_epochs": 1, "batch_size": 3},
        "checkpoint": {"every_steps": 0},
        "logging": {"tensorboard": False, "log_every": 1, "progress": False},
        "output_dir": str(run),
        "seed": 3,
        "precision": "fp32",
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[2:5]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The toy package, its data, and one `avion-ds train --plugin toy_pkg` run (2 steps), with the avion_ds
    tree hashed before and after."""
    tmp = tmp_path_factory.mktemp("task_plugin")
    before = tree_hash(REPO / "avion_ds")
    write_plugin(tmp / "plugins" / "toy_pkg")
    data = write_data(tmp)
    run = tmp / "run"
    recipe = write_toy_recipe(tmp / "toy.yaml", data, run)
    env = engine_env(PYTHONPATH=os.pathsep.join([str(tmp / "plugins"), str(REPO)]))
    ds = REPO / "ds_configs" / "zero0.json"
    train = [*CLI, "train", "--plugin", "toy_pkg", "--config", recipe, "--deepspeed_config", ds]
    log = _ok(run_process(train, env=env, timeout=300))
    return {"tmp": tmp, "run": run, "recipe": recipe, "env": env, "log": log, "before": before}


def test_a_plugin_task_trains_and_evaluates_with_avion_ds_untouched(toy_run: dict) -> None:
    run, env = toy_run["run"], toy_run["env"]
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("loss") is not None]
    assert [r["step"] for r in steps] == [1, 2], rows
    for r in steps:  # the section's value reached the loss: loss = toy_loss.weight x the task's Brier score
        assert r["toy_weight"] == pytest.approx(0.25) and r["loss"] == pytest.approx(0.25 * r["toy_brier"], rel=1e-5)
        assert 0.0 < r["toy_brier"] <= 2.0
    assert yaml.safe_load((run / "recipe.yaml").read_text())["toy_loss"] == {"weight": 0.25}
    trained = [r["eval"] for r in rows if "eval" in r]
    assert trained and set(trained[-1]) >= {"toy_acc", "toy_brier"}, rows  # the task's evaluate, during training

    out = toy_run["tmp"] / "eval.json"
    log = _ok(run_process([*CLI, "eval", "--plugin", "toy_pkg", "--checkpoint", run, "--out", out], env=env))
    result = json.loads(out.read_text())
    assert set(result["metrics"]) == {"toy_acc", "toy_brier"} and result["num_samples"] == 3, result
    assert 0.0 <= result["metrics"]["toy_acc"] <= 100.0
    line = f"toy task: toy_acc={result['metrics']['toy_acc']:.1f} toy_brier={result['metrics']['toy_brier']:.4f}"
    assert line in log.splitlines(), log[-2000:]

    assert tree_hash(REPO / "avion_ds") == toy_run["before"]  # no file of avion_ds edited
    named = [
        (str(p.relative_to(REPO)), n)
        for p in (REPO / "avion_ds").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
        for n in NAMES
        if n in p.read_text(errors="ignore")
    ]
    assert not named, named


def test_without_the_plugin_its_run_is_one_line(toy_run: dict) -> None:
    """The run's recipe names a task no module registered: one line suggesting --plugin, exit 2."""
    proc = run_process([*CLI, "eval", "--checkpoint", toy_run["run"]], env=toy_run["env"])
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "task='toy_brier_task' is not one of" in err and "--plugin MODULE" in err


def _needs_plugin(proc: subprocess.CompletedProcess, prog: str) -> None:
    """Without --plugin, the run's recipe names an unknown task: one line suggesting --plugin, exit 2."""
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, (proc.stdout[-2000:], err)
    assert err.startswith(f"avion-ds {prog}: error: task='toy_brier_task' is not one of") and "--plugin" in err, err


def test_export_and_check_of_a_plugin_run(toy_run: dict) -> None:
    """`export --format hf` (reads the run's recipe) and `check` (builds the plugin's dataset) take --plugin."""
    run, env, tmp = toy_run["run"], toy_run["env"], toy_run["tmp"]
    export = [*CLI, "export", "--checkpoint", run, "--format", "hf", "--out", tmp / "hf"]
    _needs_plugin(run_process(export, env=env), "export")
    log = _ok(run_process([*export, "--plugin", "toy_pkg"], env=env))
    assert "reloaded with transformers" in log and (tmp / "hf" / "config.json").is_file(), log[-2000:]

    check = [*CLI, "check", "--config", run / "recipe.yaml", "--out", tmp / "check", "--workers", "1"]
    _needs_plugin(run_process(check, env=env), "check")
    log = _ok(run_process([*check, "--plugin", "toy_pkg"], env=env))
    summary = json.loads((tmp / "check" / "check_summary.json").read_text())
    assert summary["annotation_rows"] == {"train": 4, "val": 3} and summary["quarantined"] == 0, (summary, log)
    assert summary["chunks_checked"] == 6  # every video the plugin dataset's rows name
    assert tree_hash(REPO / "avion_ds") == toy_run["before"]

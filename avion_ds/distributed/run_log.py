"""Run logging on rank 0: TensorBoard scalars, a JSON-lines history, a compact console line + tqdm bar.

TensorBoard tags (also listed in the README):
  train/loss, train/loss_<head>, train/lr, train/grad_norm, train/loss_scale, train/clips_per_s,
  train/skipped_nonfinite, train/applied_steps, train/overflow_steps, train/bad_samples, time/data_wait_s, time/compute_s, time/data_wait_frac, mem/peak_gib,
  eval/<metric> (top1, top5, mean_class; verb_/noun_/action_ for EPIC);
  images (the task's, at each evaluation): eval/reconstruction (pretraining), eval/confusion_<head>;
  at start: the text run/recipe (the resolved recipe) and the run's hyperparameters (HPARAMS tab).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from avion_ds.distributed import dist


def peak_memory_gib() -> float:
    """Peak accelerator memory (CUDA max allocated) or, on CPU, the process's peak RSS, in GiB."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def progress(iterable: Any = None, desc: str = "", total: int | None = None, unit: str = "batch") -> Any:
    """A tqdm bar on rank 0 when stderr is a terminal, a silent pass-through otherwise (logs, CI, other ranks)."""
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=1.0,
        leave=False,
        disable=not (dist.is_main() and sys.stderr.isatty()),
    )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0.0:
            return "0"
        return f"{v:.3e}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def _row_step(line: str) -> float:
    """A history row's step; a torn line (killed mid-write) counts as past every step."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


def hparam_values(tree: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``tree`` flattened to dotted keys with values TensorBoard's hparams take: numbers, strings and booleans
    as they are, None as "none", lists as their JSON."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(hparam_values(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = "none" if value is None else json.dumps(value, default=str)
    return out


class RunLogger:
    """Writes scalars to TensorBoard (``run_dir/tb``) and ``run_dir/history.jsonl``; rank 0 only."""

    def __init__(
        self, run_dir: str | Path, enabled: bool, tensorboard: bool = True, progress: bool = True, log_every: int = 10
    ) -> None:
        self.enabled = enabled
        self.log_every = max(1, log_every)
        self.progress = progress and enabled
        self.writer = None
        self.history = None
        self.bar = None
        if not enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.history = open(run_dir / "history.jsonl", "a", buffering=1)  # noqa: SIM115 - open for the run's life, closed by close()
        if tensorboard:
            from torch.utils.tensorboard import (  # lazy: tensorboard (+ boto3, ~0.3 s), only with logging.tensorboard
                SummaryWriter,
            )

            self.writer = SummaryWriter(str(run_dir / "tb"))

    def truncate_history(self, step: int) -> None:
        """Drop history rows past ``step`` (a resumed run writes those steps again); rank 0."""
        if self.history is None:
            return
        path = Path(self.history.name)
        self.history.close()
        keep = [ln for ln in path.read_text().splitlines(keepends=True) if _row_step(ln) <= step]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, path)
        self.history = open(path, "a", buffering=1)  # noqa: SIM115 - open for the run's life, closed by close()

    def info(self, msg: str) -> None:
        """One console line (through tqdm so it does not break the bar)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(msg, file=sys.stdout)
        else:
            print(msg, flush=True)

    def start_epoch(self, epoch: int, total: int, initial: int = 0) -> None:
        if not self.progress:
            return

        self.bar = tqdm(
            total=total,
            initial=initial,
            desc=f"epoch {epoch}",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1.0,
            leave=False,
        )

    def advance(self) -> None:
        """One optimizer step of the epoch done: the bar counts every step, not only the logged ones
        (a logged row covers ``log_every`` steps, which may span epochs)."""
        if self.bar is not None:
            self.bar.update(1)

    def end_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is not None:
            for k, v in values.items():
                if v is not None:
                    self.writer.add_scalar(k, v, step)

    def step(self, epoch: int, step: int, values: dict[str, Any], steps: int = 1) -> None:
        """Record a logged optimizer step (``values`` cover the ``steps`` since the previous logged one; the
        bar advances per step, ``advance``); console line every ``log_every`` steps."""
        if not self.enabled:
            return
        row = {"epoch": epoch, "step": step, **values}
        if self.history is not None:
            self.history.write(json.dumps(row) + "\n")
        tb = {
            f"train/{k}": v
            for k, v in values.items()
            if k not in ("data_wait_s", "compute_s", "data_wait_frac", "peak_gib")
        }
        tb.update({f"time/{k}": values[k] for k in ("data_wait_s", "compute_s", "data_wait_frac") if k in values})
        if "peak_gib" in values:
            tb["mem/peak_gib"] = values["peak_gib"]
        self.scalars(step, {k: v for k, v in tb.items() if isinstance(v, (int, float))})
        short = {
            "loss": "loss",
            "lr": "lr",
            "grad_norm": "gnorm",
            "loss_scale": "scale",
            "clips_per_s": "clips/s",
            "data_wait_frac": "wait",
            "peak_gib": "mem_gib",
            "bad_samples": "bad",
            "overflow_steps": "overflow",
            "clip_acc": "clip_acc",  # video-text tasks
            "t2v_acc": "t2v_acc",
            "logit_scale": "logit_scale",
        }
        compact = " ".join(
            f"{s}={_fmt(values[k])}"
            for k, s in short.items()
            if values.get(k) is not None and not (k in ("bad_samples", "overflow_steps") and not values[k])
        )
        if self.bar is not None:
            self.bar.set_postfix_str(compact, refresh=False)
        if step % self.log_every == 0:
            self.info(f"[ep {epoch} step {step}] {compact}")

    def eval(self, epoch: int, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.scalars(step, {f"eval/{k}": v for k, v in metrics.items()})
        if self.history is not None:
            self.history.write(json.dumps({"epoch": epoch, "step": step, "eval": metrics}) + "\n")
        self.info(f"[eval ep {epoch}] " + " ".join(f"{k}={v:.2f}" for k, v in metrics.items()))

    def run_start(self, step: int, recipe: dict[str, Any], hparams: dict[str, Any], metrics: list[str]) -> None:
        """At start: the resolved recipe as text (``run/recipe``) and the run's hyperparameters with the metric
        tags to compare runs on (TensorBoard's HPARAMS tab, its summary API: in this run, not a sub-run)."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summary  # lazy: with the writer only

        text = yaml.safe_dump(recipe, sort_keys=False)
        self.writer.add_text("run/recipe", "".join(f"    {line}\n" for line in text.splitlines()), step)
        experiment, start_info, _ = hparams_summary(hparam_values(hparams), dict.fromkeys(metrics, 0.0))
        for summary in (experiment, start_info):
            self.writer.file_writer.add_summary(summary, step)

    def images(self, step: int, images: dict[str, Any]) -> None:
        """Pictures ``{tag: (H, W, 3) uint8}`` (an evaluation's: ``Task.eval_images``)."""
        if self.writer is not None:
            for tag, img in images.items():
                self.writer.add_image(tag, img, step, dataformats="HWC")

    def close(self) -> None:
        self.end_epoch()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None
        if self.history is not None:
            self.history.close()
            self.history = None

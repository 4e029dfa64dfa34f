"""What a process pays before it works: the start-up savings of a command's process, measured A/B.

* ``train``: a 2-rank CPU training through torchrun (``launch/recipes/demo_cpu.yaml``, ZeRO-2, ``--epochs``
  epochs on the demo's synthetic data, made under ``--data`` as ``launch/demo.sh`` makes it when missing:
  the doc tests' ``DEMO_DATA``),
  with the command's imports frozen for the collector (the default, ``avion_ds.cli.freeze_imports``) and
  without (``AVION_DS_GC_FREEZE=0``): CPU seconds of the whole launch (launcher, ranks, loader workers, decode
  helpers: the children's ``getrusage``) and wall seconds.
* ``tokenizer``: a process that imports torch and tokenizes one text, through ``avion_ds.data.tokenizer``
  (OpenCLIP's tokenizer module run from its file) and through ``open_clip.tokenizer`` (the package's
  ``__init__``: every open_clip model and transformers): CPU seconds of each process.
* ``meta``: building every registered model (``--models``: names containing this text) on the meta device for
  its shapes, as ``avion-ds models``, the tasks' summaries and the memory plans do: ``meta_device`` (weight
  init skipped) vs plain ``torch.device("meta")``, in this process (CPU and wall seconds of the builds).
* ``dynamo``: the same training in the test suite's rank environment (``TORCHDYNAMO_DISABLE=1``, set by
  ``tests/helpers/env.py: engine_env``: DeepSpeed's ZeRO optimizer check imports its Muon module, whose
  ``torch.compile`` decorators load inductor) and in a user's (unset).

The two sides take turns (``--warmup`` rounds first, then ``--reps`` timed rounds; who goes first alternates),
so load on a shared machine hits them alike; medians and their ratio are printed.

    python bench/startup.py                              # every part (~5 min on 2 cores)
    python bench/startup.py --parts tokenizer --reps 9
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from avion_ds.distributed.dist import free_port
from tests.e2e.conftest import DEMO_DATA  # the demo's data step, as the doc tests make it
from tests.helpers.env import engine_env

TOKENIZE = {
    "avion_ds": "import torch; from avion_ds.data.tokenizer import tokenize; tokenize('cut the onion')",
    "open_clip": "import torch; from open_clip.tokenizer import SimpleTokenizer; SimpleTokenizer()('cut the onion')",
}


def measured(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[float, float]:
    """(CPU seconds of ``cmd`` and every process it waited for, wall seconds); exits on a failure."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def ab(sides: dict[str, Callable[[], tuple[float, float]]], warmup: int, reps: int) -> dict[str, list[tuple]]:
    """Each side run ``warmup`` + ``reps`` times, taking turns (who goes first alternates); the timed rounds."""
    names, out = list(sides), {name: [] for name in sides}
    for i in range(warmup + reps):
        for name in names if i % 2 == 0 else names[::-1]:
            got = sides[name]()
            if i >= warmup:
                out[name].append(got)
    return out


def report(part: str, got: dict[str, list[tuple]], base: str) -> None:
    cpu = {k: statistics.median(c for c, _ in v) for k, v in got.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in got.items()}
    for name, rounds in got.items():
        print(f"[{part}] {name:<10} CPU {cpu[name]:6.2f} s  wall {wall[name]:6.2f} s  (median of {len(rounds)})")
    other = next(k for k in got if k != base)
    print(
        f"[{part}] {base} / {other}: CPU {cpu[base] / cpu[other]:.3f}x ({cpu[base] - cpu[other]:+.2f} s), "
        f"wall {wall[base] / wall[other]:.3f}x"
    )


def demo_data(data: Path) -> Path:
    """The demo's synthetic data under ``data`` (made as ``launch/demo.sh`` makes it, when missing)."""
    demo = data / "demo"
    if not (demo / "chunks" / "manifest.jsonl").is_file():
        data.mkdir(parents=True, exist_ok=True)
        measured(["bash", "-c", f"set -euo pipefail\n{DEMO_DATA}"], engine_env(), cwd=data)
    return demo


def training(demo: Path, out: Path, epochs: float, **env: str | None) -> Callable[[], tuple[float, float]]:
    """One side: the 2-rank demo training into ``out`` under ``engine_env(**env)``."""

    def go() -> tuple[float, float]:
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        cmd += ["--master_port", str(free_port()), str(REPO / "launch" / "train.py")]
        cmd += ["--config", str(REPO / "launch/recipes/demo_cpu.yaml"), "--deepspeed_config"]
        cmd += [str(REPO / "ds_configs/zero2.json"), "--set", f"data.root={demo}/chunks"]
        cmd += ["--set", f"data.train_csv={demo}/synth/train.csv", "--set", f"data.val_csv={demo}/synth/val.csv"]
        cmd += ["--set", f"schedule.epochs={epochs}", "--set", "eval.every_epochs=1", "--set", f"output_dir={out}"]
        cmd += ["--set", "logging.tensorboard=false"]
        return measured(cmd, engine_env(**env))

    return go


def train_part(data: Path, epochs: float, warmup: int, reps: int) -> None:
    """Imports frozen (the default) vs not, with ``torch.compile`` on as a user's run has it."""
    demo, runs = demo_data(data), data / "runs"
    sides = {
        f"{'' if f == '1' else 'un'}frozen": training(
            demo, runs / f"freeze{f}", epochs, AVION_DS_GC_FREEZE=f, TORCHDYNAMO_DISABLE=None
        )
        for f in ("1", "0")
    }
    report("train", ab(sides, warmup, reps), "frozen")


def dynamo_part(data: Path, epochs: float, warmup: int, reps: int) -> None:
    """The suite's rank environment (``TORCHDYNAMO_DISABLE=1``: DeepSpeed's Muon decorators do not load
    inductor) vs a user's (unset)."""
    demo, runs = demo_data(data), data / "runs"
    sides = {
        "no-dynamo": training(demo, runs / "dynamo0", epochs, TORCHDYNAMO_DISABLE="1"),
        "dynamo": training(demo, runs / "dynamo1", epochs, TORCHDYNAMO_DISABLE=None),
    }
    report("dynamo", ab(sides, warmup, reps), "no-dynamo")


def tokenizer_part(warmup: int, reps: int) -> None:
    sides = {
        k: (lambda code=code: measured([sys.executable, "-c", code], engine_env())) for k, code in TOKENIZE.items()
    }
    report("tokenizer", ab(sides, warmup, reps), "avion_ds")


def meta_builds(names: list[str], skip_init: bool) -> Callable[[], tuple[float, float]]:
    """One side: every model of ``names`` built on the meta device, with ``meta_device`` or without."""
    import torch

    from avion_ds.models import create_model
    from avion_ds.models.meta import meta_device

    def go() -> tuple[float, float]:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for name in names:
            with meta_device() if skip_init else torch.device("meta"):
                create_model(name)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), time.perf_counter() - t0

    return go


def meta_part(pattern: str, warmup: int, reps: int) -> None:
    from avion_ds.models import list_models

    names = list_models(pattern)
    print(f"[meta] {len(names)} registered models containing {pattern!r}")
    sides = {"meta_device": meta_builds(names, True), "plain": meta_builds(names, False)}
    report("meta", ab(sides, warmup, reps), "meta_device")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--parts", default="train,dynamo,tokenizer,meta", help="comma-separated: train, dynamo, tokenizer, meta"
    )
    p.add_argument("--models", default="", help="meta: only the registered names containing this text")
    p.add_argument("--data", default="/tmp/avion_startup", help="the demo's data (made here when missing)")
    p.add_argument("--epochs", type=float, default=1, help="training epochs per run (18 steps each)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--reps", type=int, default=4, help="timed rounds")
    a = p.parse_args()
    parts = a.parts.split(",")
    if unknown := set(parts) - {"train", "dynamo", "tokenizer", "meta"}:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}")
    if "tokenizer" in parts:
        tokenizer_part(a.warmup, a.reps)
    if "meta" in parts:
        meta_part(a.models, a.warmup, a.reps)
    if "train" in parts:
        train_part(Path(a.data), a.epochs, a.warmup, a.reps)
    if "dynamo" in parts:
        dynamo_part(Path(a.data), a.epochs, a.warmup, a.reps)


if __name__ == "__main__":
    main()

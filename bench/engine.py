"""Engine overhead and data-wait benchmark (one process, run side by side in one invocation).

1. Step time of a plain PyTorch loop (AdamW, same param groups, clipping) vs the training loop's
   step (``Trainer.train_step`` on the DeepSpeed engine) with ZeRO-0 and ZeRO-2 on the same model,
   batch and device -> ratio (target <= 1.03 for ZeRO-0). Inputs are pre-made tensors so only the
   optimisation step is timed; the variants take turns step by step, so background load on a shared
   machine hits them alike.
2. Data-wait fraction of the real training input path (synthetic EPIC chunks -> dataset -> loader ->
   device augment -> step) with 0 vs 2 loader workers.

    python bench/engine.py [--model vit_test_small] [--steps 30] [--batch 8]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avion_ds.distributed import dist
from avion_ds.distributed.ds_config import build_ds_config, scaled_lr
from avion_ds.engine.optim import client_adamw, optimizer_groups
from avion_ds.engine.schedule import WarmupCosine
from avion_ds.tasks import load_recipe
from avion_ds.tasks.finetune.losses import total_loss


def recipe_for(args: argparse.Namespace, data: dict | None = None, workers: int = 0):
    over = [
        f"model.name={args.model}",
        "model.heads={verb: 4, noun: 3}",
        f"data.num_frames={args.frames}",
        f"data.size={args.size}",
        f"batch.global_batch={args.batch}",
        f"batch.micro_batch={args.batch}",
        "optim.clip_grad=1.0",
        "model.drop_path_rate=0.0",
        "precision=fp32",
        f"data.workers={workers}",
        "data.decoder=decord",
    ]
    if data:
        over += [f"data.root={data['root']}", f"data.train_csv={data['train_csv']}", f"data.val_csv={data['val_csv']}"]
    return load_recipe(None, over)


def make_model(recipe):
    from avion_ds.tasks import task_of

    torch.manual_seed(0)
    return task_of(recipe).build_model(recipe)


def batch_for(recipe, n: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, recipe.data.num_frames, recipe.data.size, recipe.data.size, generator=g)
    y = {"verb": torch.randint(0, 4, (n,), generator=g), "noun": torch.randint(0, 3, (n,), generator=g)}
    return x, y


CLOCK = time.perf_counter  # --clock cpu: time.process_time (this process's CPU time, all its threads)


def plain_step(recipe, device):
    model = make_model(recipe).to(device)
    groups = optimizer_groups(model, recipe)
    lr = scaled_lr(recipe, recipe.batch.micro_batch)
    opt = client_adamw(groups, recipe, lr)
    sched = WarmupCosine(opt, lr, recipe.optim.min_lr, 5, 1000)
    x, y = batch_for(recipe, recipe.batch.micro_batch)
    x, y = x.to(device), {k: v.to(device) for k, v in y.items()}

    def step() -> None:
        loss, _ = total_loss(model(x), y, 0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optim.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()

    return step


class StepTimer:
    """Splits wall time into data wait (fetch + host->device + augment) and compute (fwd/bwd/step)."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.data = 0.0
        self.compute = 0.0
        self._t = time.perf_counter()

    def _now(self) -> float:
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def mark_data(self) -> None:
        t = self._now()
        self.data += t - self._t
        self._t = t

    def mark_compute(self) -> None:
        t = self._now()
        self.compute += t - self._t
        self._t = t

    def pop(self) -> tuple[float, float]:
        d, c = self.data, self.compute
        self.data = self.compute = 0.0
        return d, c


def ds_step(recipe, device, config: str):
    """The training loop's own step (``Trainer.train_step``, logging every ``logging.log_every`` steps)."""
    from avion_ds.engine.parallelize import parallelize
    from avion_ds.engine.trainer import Trainer

    cfg = build_ds_config(REPO / "ds_configs" / config, recipe, dist.world_size(), steps_per_epoch=1000)
    from avion_ds.tasks import task_of

    trainer = Trainer(parallelize(make_model(recipe), recipe, cfg, steps_per_epoch=1000), recipe, task_of(recipe))
    x, y = batch_for(recipe, recipe.batch.micro_batch)
    batches = itertools.repeat({"frames": x.to(device), "label": {k: v.to(device) for k, v in y.items()}})

    def step() -> None:
        trainer.train_step(batches)

    return step


def interleaved(steps: dict, n: int, warmup: int = 3) -> dict[str, list[float]]:
    """Time ``n`` steps of each variant, one step of each in turn (background load hits all alike)."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    out: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(n):
        for k, step in steps.items():
            t = CLOCK()
            step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            out[k].append(CLOCK() - t)
    return out


def bench_data_wait(args: argparse.Namespace, device, data: dict, workers: int) -> tuple[float, float]:
    """Fraction of wall time spent waiting for input, and clips/s, over ``args.data_steps`` steps."""
    from avion_ds.data import DeviceAugment, build_dataset, build_loader

    recipe = recipe_for(args, data, workers)
    model = make_model(recipe).to(device)
    opt = client_adamw(optimizer_groups(model, recipe), recipe, 1e-4)
    ds = build_dataset(recipe.data, "train", seed=0, sections=recipe.sections)
    loader = build_loader(
        ds, recipe.batch.micro_batch, workers, shuffle=True, seed=0, drop_last=True, distributed=False
    )
    aug = DeviceAugment(recipe.data, ds.num_classes, train=True)
    timer = StepTimer(sync=device.type == "cuda")
    done, epoch, clips = 0, 0, 0
    t0 = None
    while done < args.data_steps + 2:
        loader.sampler.set_epoch(epoch)
        ds.set_epoch(epoch)
        for batch in loader:
            frames = batch["frames"].to(device)
            labels = {k: v.to(device) for k, v in batch["label"].items()}
            x, y = aug(frames, labels)
            timer.mark_data()
            loss, _ = total_loss(model(x), y, 0.1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            timer.mark_compute()
            done += 1
            if done == 2:  # drop worker start-up and first-decode costs
                timer.pop()
                t0 = time.perf_counter()
            elif done > 2:
                clips += frames.shape[0]
            if done >= args.data_steps + 2:
                break
        epoch += 1
    wait, compute = timer.pop()
    return wait / (wait + compute), clips / (time.perf_counter() - t0)


def make_data(root: Path, size: int) -> dict:
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic

    info = make_synthetic_epic(
        root / "synth", num_videos=4, segments_per_video=16, width=max(96, size + 32), height=max(72, size + 8), fps=15
    )
    chunk_videos(info["videos"], root / "chunks", chunk_seconds=15.0, short_side=None, fps=15, gop=15, progress=False)
    return {"root": root / "chunks", "train_csv": info["train_csv"], "val_csv": info["val_csv"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_test_small")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--data-steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2, help="alternate plain / DS this many times")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="step timer: wall clock, or this process's CPU time (less sensitive to other "
        "processes on a shared machine; use with OMP_NUM_THREADS=1, CPU only)",
    )
    p.add_argument("--no-data", action="store_true", help="skip part 2 (data wait)")
    args = p.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_extensions"))
    dist.init()
    from deepspeed.accelerator import get_accelerator

    device = torch.device(get_accelerator().current_device_name())
    recipe = recipe_for(args)
    print("load average (1, 5, 15 min) at start: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(
        f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, clock {args.clock}, model {args.model} "
        f"{args.frames}x{args.size}, batch {args.batch}, {args.steps} timed steps x {args.repeats} repeats"
    )
    times: dict[str, list[float]] = {"plain": [], "zero0": [], "zero2": []}
    for _ in range(args.repeats):  # fresh models each repeat; steps interleaved one by one
        steps = {
            "plain": plain_step(recipe, device),
            "zero0": ds_step(recipe, device, "zero0.json"),
            "zero2": ds_step(recipe, device, "zero2.json"),
        }
        for k, v in interleaved(steps, args.steps).items():
            times[k] += v
        del steps
    med = {k: statistics.median(v) for k, v in times.items()}
    print("load average (1, 5, 15 min) after the step timings: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"{'variant':<22}{'median step ms':>16}{'ratio vs plain':>16}")
    print(f"{'plain PyTorch AdamW':<22}{1e3 * med['plain']:>16.2f}{1.0:>16.3f}")
    for k in ("zero0", "zero2"):
        print(
            f"{'DeepSpeed ' + k.upper().replace('ZERO', 'ZeRO-'):<22}{1e3 * med[k]:>16.2f}{med[k] / med['plain']:>16.3f}"
        )
    if args.no_data:
        return dist.shutdown(0)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp), args.size)
        print(f"{'loader workers':<22}{'data-wait frac':>16}{'clips/s':>16}")
        for w in (0, 2):
            frac, cps = bench_data_wait(args, device, data, w)
            print(f"{w:<22}{frac:>16.3f}{cps:>16.1f}")
    return dist.shutdown(0)


if __name__ == "__main__":
    sys.exit(main())

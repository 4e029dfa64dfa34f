"""Contrastive pretraining step through the engine (``Trainer.train_step``, task: contrastive), side by
side in ONE process: a batch of B clips as one micro-batch vs the same B clips as ``--accum`` micro-batches
with the feature cache (embed all without gradient, then recompute each with gradient against the whole
batch's loss). The cache's cost is one extra forward per clip: expected ratio ~ (1 + 3) / 3 = 1.33 when a
backward costs two forwards. Variants run round-robin, best of ``--iters`` each; DeepSpeed ZeRO-0 on the
CPU accelerator (one rank), fp32 unless ``--precision``.

Examples:
    python bench/contrastive.py                                   # ViT-B/16, 4 frames x 224, B=4 (~2-3 min on 2 cores)
    python bench/contrastive.py --model clip_vit_test_tiny --size 32 --frames 2 --batch 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from avion_ds.engine.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


def build(args: argparse.Namespace, accum: int) -> tuple[Trainer, int]:
    from avion_ds.distributed.ds_config import build_ds_config
    from avion_ds.engine.parallelize import parallelize
    from avion_ds.engine.trainer import Trainer
    from avion_ds.tasks import load_recipe, task_of

    micro = args.batch // accum
    recipe = load_recipe(
        None,
        [
            "task=contrastive",
            f"model.name={args.model}",
            f"data.num_frames={args.frames}",
            f"data.size={args.size}",
            f"batch.micro_batch={micro}",
            f"batch.global_batch={args.batch}",
            f"precision={args.precision}",
            f"model.activation_checkpointing={str(args.ckpt).lower()}",
            "logging.log_every=100000",
            "output_dir=/tmp/bench_contrastive",
        ],
    )
    cfg = build_ds_config(REPO / "ds_configs" / "zero0.json", recipe, 1, steps_per_epoch=1000)
    task = task_of(recipe)
    torch.manual_seed(0)
    parallel = parallelize(task.build_model(recipe, pretrained="", ds_config=cfg), recipe, cfg, steps_per_epoch=1000)
    return Trainer(parallel, recipe, task), micro


def batches(args: argparse.Namespace, micro: int, accum: int) -> list[dict]:
    from avion_ds.data.tokenizer import tokenize

    g = torch.Generator().manual_seed(0)
    frames = torch.randn(args.batch, 3, args.frames, args.size, args.size, generator=g)
    tokens = tokenize([f"#C C moves object {i} to the left of the board" for i in range(args.batch)])
    return [
        {"frames": frames[i * micro : (i + 1) * micro], "label": {"tokens": tokens[i * micro : (i + 1) * micro]}}
        for i in range(accum)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="clip_vit_base_patch16_224")
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--ckpt", action="store_true", help="activation checkpointing on both towers")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    from avion_ds.distributed import dist

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(dist.free_port()))
    dist.init()
    variants = {1: build(args, 1), args.accum: build(args, args.accum)}
    best = dict.fromkeys(variants, float("inf"))
    for i in range(args.warmup + args.iters):
        for accum, (trainer, micro) in variants.items():
            data = batches(args, micro, accum)
            t0 = time.perf_counter()
            assert trainer.train_step(iter(data))
            if i >= args.warmup:
                best[accum] = min(best[accum], time.perf_counter() - t0)
    print(
        f"model={args.model} input={args.batch}x3x{args.frames}x{args.size}^2 + {args.batch}x77 tokens, "
        f"{args.precision}, checkpointing {'on' if args.ckpt else 'off'}, ZeRO-0 one CPU rank, best of {args.iters}, "
        f"torch={torch.__version__} threads={torch.get_num_threads()}"
    )
    print(f"{'variant':<34} {'step s':>8} {'clips/s':>8} {'ratio':>6}")
    base = best[1]
    for accum, t in best.items():
        name = "one micro-batch" if accum == 1 else f"{accum} micro-batches, feature cache"
        print(f"{name:<34} {t:8.3f} {args.batch / t:8.2f} {t / base:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

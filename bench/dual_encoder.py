"""Video-text dual encoder micro-benchmark: a contrastive train step's clips/s and saved activations.

One step = ``model(frames, tokens)`` -> CLIP's symmetric cross-entropy over the batch's video x text
logits -> backward, as AVION's pretraining trains (the loss is written here; the contrastive task
comes separately). Variants (activation checkpointing off / on; attention backends) run
round-robin in ONE process, best of ``--iters`` each. Saved activation bytes are the exact
saved-tensor count (``measure_activation_bytes``) next to the planner's formula
(``activation_bytes_per_clip``), per clip.

CPU (default): clip_vit_base_patch16_224, 4 frames x 224, batch 2, fp32.
GPU: ``--device cuda --dtype bf16 --batch 256 --backends flash sdpa`` (AVION's 256 clips/GPU with
checkpointing: add ``--ckpt-only``) adds peak CUDA memory.

Examples:
    python bench/dual_encoder.py                              # CPU, ~2-3 min on 2 cores
    python bench/dual_encoder.py --device cuda --dtype bf16 --batch 256 --backends flash sdpa --ckpt-only
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from avion_ds.data.tokenizer import tokenize
from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.memory.estimate import activation_bytes_per_clip, arch_info
from avion_ds.models import apply_activation_checkpointing, create_model, model_flops
from avion_ds.models.attention import flash_available

CAPTIONS = ["#C C cuts the onion on the chopping board", "#C C opens the fridge door with the left hand"]


def contrastive_step(model: torch.nn.Module, frames: torch.Tensor, tokens: torch.Tensor) -> float:
    """Forward, CLIP's symmetric cross-entropy (labels arange(B)), backward; returns the loss."""
    video, text, scale = model(frames, tokens)
    logits = scale * video.float() @ text.float().t()
    labels = torch.arange(logits.shape[0], device=logits.device)
    loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> list[dict]:
    device, dtype = torch.device(args.device), torch_dtype(args.dtype)
    ckpts = [True] if args.ckpt_only else [False, True]
    backends = [b for b in args.backends if b != "flash" or (flash_available() and device.type == "cuda")]
    for b in sorted(set(args.backends) - set(backends)):
        print(f"skip {b}: flash-attn needs CUDA and the flash-attn package", file=sys.stderr)
    variants = [(b, c) for b in backends for c in ckpts]
    models = {}
    for backend, ckpt in variants:
        torch.manual_seed(0)
        m = create_model(args.model, num_frames=args.frames, attn_backend=backend).to(device, dtype).train()
        models[(backend, ckpt)] = apply_activation_checkpointing(m) if ckpt else m
    frames = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    tokens = tokenize((CAPTIONS * args.batch)[: args.batch]).to(device)
    best = {v: float("inf") for v in variants}
    peak = dict.fromkeys(variants, 0)
    for i in range(args.warmup + args.iters):
        for v in variants:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t0 = time.perf_counter()
            contrastive_step(models[v], frames, tokens)
            _sync(device)
            if i >= args.warmup:
                best[v] = min(best[v], time.perf_counter() - t0)
                if device.type == "cuda":
                    peak[v] = max(peak[v], torch.cuda.max_memory_allocated(device))
    rows = []
    plain = next(iter(models.values()))
    info = arch_info(plain)
    one = frames[:1]
    for backend, ckpt in variants:
        measured = measure_activation_bytes(plain, one, checkpointing=ckpt) if device.type == "cpu" else None
        rows.append(
            {
                "variant": f"attn={backend}" + (" +AC" if ckpt else ""),
                "step_s": best[(backend, ckpt)],
                "clips_s": args.batch / best[(backend, ckpt)],
                "act_measured": measured,
                "act_formula": activation_bytes_per_clip(info, args.frames, args.size, dtype, ckpt, None, backend),
                "peak": peak[(backend, ckpt)],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="clip_vit_base_patch16_224")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=PRECISIONS)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--backends", nargs="+", default=["sdpa"])
    p.add_argument("--ckpt-only", action="store_true", help="only the checkpointed variants (large batches)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    rows = run(args)
    gflops = model_flops(args.model, num_frames=args.frames, img_size=args.size) / 1e9
    print(
        f"model={args.model} device={args.device} dtype={args.dtype} input={args.batch}x3x{args.frames}x{args.size}^2 "
        f"+ {args.batch}x77 tokens, best of {args.iters}, torch={torch.__version__} threads={torch.get_num_threads()}, "
        f"forward {gflops:.1f} GFLOPs/clip"
    )
    print(f"{'variant':<18} {'step s':>8} {'clips/s':>8} {'act MiB/clip':>13} {'formula':>10} {'peak MiB':>9}")
    for r in rows:
        act = "n/a" if r["act_measured"] is None else f"{r['act_measured'] / 2**20:.2f}"
        peak = f"{r['peak'] / 2**20:.0f}" if r["peak"] else "n/a"
        print(
            f"{r['variant']:<18} {r['step_s']:>8.3f} {r['clips_s']:>8.3f} {act:>13} "
            f"{r['act_formula'] / 2**20:>10.2f} {peak:>9}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

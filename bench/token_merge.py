"""Token merging (ToMe) speed: evaluation clips/s and fine-tuning step time with vs without merging, one process.

For each model, two copies with the same weights: ``token_merge=0`` and ``token_merge=r``, both on the SDPA
backend (merging's proportional attention is a mask, which flash-attn cannot take: ``models/attention.py``
chooses SDPA when merging is on, so the baseline runs SDPA too and the ratio is merging's alone). ``r`` is
chosen so the last block sees about half the tokens: ``r = ceil(N / (2 (depth - 1)))`` for N patch tokens
("~2x fewer tokens by the last block"), unless ``--r`` names it; ``--mean-fraction F`` instead merges as
hard as the paper's video setting: a constant ``r`` clamped per block to what it can merge, the smallest whose
blocks see on average at most ``F`` of the tokens.

Per model and variant, in turn (``--warmup`` rounds first, then ``--iters`` timed rounds, A/B alternating):
* eval: ``model.eval()`` forward under ``no_grad`` (the evaluation / ``avion-ds embed`` path);
* train: forward + backward + AdamW step in ``model.train()`` (fine-tuning).
Printed: median seconds, clips/s and the ratios merged / unmerged; on CUDA the peak memory of each.

    python bench/token_merge.py                                       # ViT-B 8x224 fp32, CPU (~3 min)
    python bench/token_merge.py --device cuda --dtype bf16 --batch 16 \\
        --models vit_base_patch16_224 vit_large_patch16_224 --frames 16  # the users' sizes on a GPU
    python bench/token_merge.py --tiny                                # test-size model (smoke test)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.models import create_model
from avion_ds.models.token_merge import max_merge


def half_tokens_r(tokens: int, depth: int) -> int:
    """The constant r per block that leaves the last block about half of ``tokens``."""
    return math.ceil(tokens / (2 * max(depth - 1, 1)))


def clamped_schedule(r: int, tokens: int, depth: int) -> list[int]:
    """``r`` per block, each clamped to what that block can merge (half its tokens): the schedule a large
    constant ``r`` runs as (the paper's video setting merges this hard)."""
    out, left = [], tokens
    for _ in range(depth):
        out.append(min(r, max_merge(left, False)))
        left -= out[-1]
    return out


def seen_tokens(schedule: list[int], tokens: int) -> list[int]:
    """The tokens each block's input has under ``schedule``."""
    seen, left = [], tokens
    for r in schedule:
        seen.append(left)
        left -= r
    return seen


def schedule_for_mean(fraction: float, tokens: int, depth: int) -> list[int]:
    """The smallest clamped constant-``r`` schedule whose blocks see on average at most ``fraction`` of the
    tokens (the work the blocks do scales with the tokens they see)."""
    for r in range(tokens // 2 + 1):
        sched = clamped_schedule(r, tokens, depth)
        if sum(seen_tokens(sched, tokens)) <= fraction * tokens * depth:
            return sched
    return clamped_schedule(tokens // 2, tokens, depth)


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work so wall time covers the step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps_of(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Callable[[], None]]:
    """The eval forward and the train step (forward, backward, AdamW) of ``model`` on ``x``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def evaluate() -> None:
        model.eval()
        with torch.no_grad():
            model(x)

    def train() -> None:
        model.train()
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"eval": evaluate, "train": train}


def measure(steps: dict[str, Callable[[], None]], device: torch.device, warmup: int, iters: int):
    """Median seconds and peak CUDA bytes per step name, the steps alternating round by round."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    peak: dict[str, int] = {}
    for _ in range(iters):
        for k, step in steps.items():
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t = time.perf_counter()
            step()
            sync(device)
            times[k].append(time.perf_counter() - t)
            if device.type == "cuda":
                peak[k] = torch.cuda.max_memory_allocated(device)
    return {k: statistics.median(v) for k, v in times.items()}, peak


def bench_model(name: str, args: argparse.Namespace) -> None:
    """Merged vs unmerged copies of ``name``: eval and train, alternating, the ratios printed."""
    device, dtype = torch.device(args.device), torch_dtype(args.dtype)
    geometry = {"num_frames": args.frames, "img_size": args.size, "attn_backend": "sdpa"}
    torch.manual_seed(0)
    base = create_model(name, **geometry)
    arch = base.arch if hasattr(base, "arch") else None
    tokens = base.patch_embed.num_patches if arch is None else arch.kept_patches
    depth = len(base.blocks)
    if args.mean_fraction:
        merge: int | list[int] = schedule_for_mean(args.mean_fraction, tokens, depth)
    else:
        merge = args.r if args.r is not None else half_tokens_r(tokens, depth)
    sched = merge if isinstance(merge, list) else [merge] * depth
    r = sched[0] if len(set(sched)) == 1 else f"{sched[0]}..{sched[-1]}"
    merged = create_model(name, token_merge=merge, **geometry)
    merged.load_state_dict(base.state_dict())
    seen = seen_tokens(sched, tokens)
    last = seen[-1]
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    models = {"r=0": base.to(device, dtype), f"r={r}": merged.to(device, dtype)}
    steps = {f"{v} {k}": s for v, m in models.items() for k, s in steps_of(m, x).items()}
    if args.bias_cost:  # the merged model's eval with proportional attention's bias dropped (timing only)
        steps["no-bias eval"] = without_size_bias(steps[f"r={r} eval"])
    med, peak = measure(steps, device, args.warmup, args.iters)
    print(
        f"{name}: {args.frames}x{args.size}, {tokens} tokens, depth {depth}, r={r} per block -> last block sees "
        f"{last} ({last / tokens:.0%}), blocks see {sum(seen) / len(seen) / tokens:.0%} of the tokens on average, "
        f"batch {args.batch}"
    )
    for kind in ("eval", "train"):
        a, b = med[f"r=0 {kind}"], med[f"r={r} {kind}"]
        mem = ""
        if peak:
            mem = f", peak {peak[f'r=0 {kind}'] / 2**30:.2f} -> {peak[f'r={r} {kind}'] / 2**30:.2f} GiB"
        print(
            f"  {kind:5s} r=0 {a * 1e3:9.1f} ms ({args.batch / a:8.1f} clips/s)   r={r} {b * 1e3:9.1f} ms "
            f"({args.batch / b:8.1f} clips/s)   clips/s x{a / b:.2f}, time x{b / a:.2f}{mem}"
        )
    if args.bias_cost:
        c, b = med["no-bias eval"], med[f"r={r} eval"]
        print(
            f"  eval  r={r} without the log-size bias (attention without a mask; outputs differ, timing only) "
            f"{c * 1e3:.1f} ms: the bias costs x{b / c:.2f} of the merged forward"
        )


def without_size_bias(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with proportional attention's log-size bias dropped (the attention then takes no mask, so
    SDPA may pick its fastest kernel): what the bias costs, measured; the outputs are not the model's."""
    import avion_ds.models.vit.model as vit

    def run() -> None:
        keep = vit.size_bias
        vit.size_bias = lambda size, dtype: None
        try:
            step()
        finally:
            vit.size_bias = keep

    return run


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=PRECISIONS)
    p.add_argument("--models", nargs="+", default=["vit_base_patch16_224"])
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--r", type=int, default=None, help="tokens merged per block (default: half by the last block)")
    p.add_argument(
        "--mean-fraction",
        type=float,
        default=0.0,
        help="instead of --r: the clamped constant-r schedule whose blocks see this fraction of the tokens on average",
    )
    p.add_argument(
        "--bias-cost", action="store_true", help="also time the merged eval without the log-size bias (timing only)"
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--tiny", action="store_true", help="test-size model (the smoke test)")
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.frames, args.size, args.batch, args.r = ["vit_test_tiny"], 4, 64, 2, 4
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.dtype}, {args.warmup} warm-up + {args.iters} timed rounds")
    for name in args.models:
        bench_model(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Model micro-benchmark: forward+backward clips/s and activation bytes, variants side by side.

CPU (default): vit_base_patch16_224 at 8 x 224 (16 x 224 is too slow on a 2-core VM), batch 1,
comparing attention eager vs sdpa and Conv3d vs linear tubelet embedding (plus activation
checkpointing for the activation bytes). Variants run round-robin in ONE process (best of --iters per variant) and results are
printed as ratios against the first variant, so machine load affects them alike.

GPU: ``--device cuda --dtype bf16 --frames 16 --models vit_base_patch16_224 vit_large_patch16_224
--backends flash sdpa eager`` reports clips/s, peak CUDA memory and MFU
(= clips/s * 3 * forward FLOPs / peak FLOP/s; forward FLOPs from ``model_flops``).

Examples:
    python bench/model.py                         # CPU defaults (~3-4 min on 2 cores)
    python bench/model.py --device cuda --dtype bf16 --frames 16 --batch 8 \
        --models vit_base_patch16_224 vit_large_patch16_224 --backends flash sdpa eager --embeds linear
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.models import apply_activation_checkpointing, create_model, model_flops
from avion_ds.models.attention import flash_available

# dense bf16 tensor-core peak per GPU (FLOP/s), for MFU when --peak-tflops is not given
_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10": 125e12,
    "4090": 165e12,
    "3090": 71e12,
}


@dataclass
class Variant:
    model: str
    backend: str
    embed: str
    ckpt: bool = False

    @property
    def label(self) -> str:
        short = self.model.replace("_patch16_224", "").replace("_patch14_224", "")
        return f"{short} attn={self.backend} embed={self.embed}" + (" +AC" if self.ckpt else "")


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    out = model(x)
    out.float().square().mean().backward()
    model.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    dtype = torch_dtype(args.dtype)
    if args.grid:
        variants = [Variant(m, b, e) for m in args.models for b in args.backends for e in args.embeds]
    else:  # the first backend/embed is the baseline; change one factor at a time
        b0, e0 = args.backends[0], args.embeds[0]
        variants = [Variant(m, b0, e0) for m in args.models]
        variants += [Variant(m, b, e0) for m in args.models for b in args.backends[1:]]
        variants += [Variant(m, b0, e) for m in args.models for e in args.embeds[1:]]
    if args.ckpt:
        variants += [Variant(m, args.backends[0], args.embeds[0], ckpt=True) for m in args.models]
    built = []
    for v in variants:
        if v.backend == "flash" and not (flash_available() and device.type == "cuda"):
            print(f"skip {v.label}: flash-attn needs CUDA and the flash-attn package", file=sys.stderr)
            continue
        torch.manual_seed(0)
        model = (
            create_model(
                v.model, num_frames=args.frames, img_size=args.size, attn_backend=v.backend, patch_embed=v.embed
            )
            .to(device=device, dtype=dtype)
            .train()
        )
        if v.ckpt:
            apply_activation_checkpointing(model)
        built.append((v, model))
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    times: dict[str, list[float]] = {v.label: [] for v, _ in built}
    act: dict[str, int] = {}
    peak_mem: dict[str, int] = {}
    for v, model in built:  # activation bytes + warm-up
        act[v.label] = measure_activation_bytes(model, x)  # the package's saved-tensor counter
        for _ in range(args.warmup):
            _step(model, x)
    for _ in range(args.iters):  # round-robin so load changes hit every variant alike
        for v, model in built:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t0 = time.perf_counter()
            _step(model, x)
            _sync(device)
            times[v.label].append(time.perf_counter() - t0)
            if device.type == "cuda":
                peak_mem[v.label] = torch.cuda.max_memory_allocated(device)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak is None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((f for k, f in _PEAK_BF16.items() if k in name), None)
    rows = []
    for v, _ in built:
        t = min(times[v.label])
        clips = args.batch / t
        flops = 3 * model_flops(v.model, num_frames=args.frames, img_size=args.size)
        rows.append(
            {
                "variant": v.label,
                "step_s": t,
                "clips_s": clips,
                "act_bytes": act[v.label],
                "peak_mem": peak_mem.get(v.label),
                "tflops": clips * flops / 1e12,
                "mfu": clips * flops / peak if peak else None,
            }
        )
    return rows


def embed_only(args: argparse.Namespace) -> str:
    """Tubelet embedding alone (fwd+bwd, input gradient off as in training): linear vs Conv3d."""
    from avion_ds.models.patch_embed import PatchEmbed

    device = torch.device(args.device)
    dtype = torch_dtype(args.dtype)
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    mods = {m: PatchEmbed(args.size, 16, 2, args.frames, 3, 768, mode=m).to(device, dtype) for m in ("linear", "conv")}
    mods["conv"].load_state_dict(mods["linear"].state_dict())
    times: dict[str, list[float]] = {m: [] for m in mods}
    for i in range(args.embed_iters + 2):
        for m, mod in mods.items():
            _sync(device)
            t0 = time.perf_counter()
            mod(x).float().square().mean().backward()
            _sync(device)
            if i >= 2:
                times[m].append(time.perf_counter() - t0)
    lin, conv = (min(times[m]) for m in ("linear", "conv"))
    return (
        f"tubelet embedding alone (768 wide, {args.batch}x3x{args.frames}x{args.size}x{args.size}, fwd+bwd, "
        f"best of {args.embed_iters}): linear {1e3 * lin:.1f} ms, conv3d {1e3 * conv:.1f} ms, "
        f"linear speed-up x{conv / lin:.2f}"
    )


def report(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        (
            f"device={args.device} dtype={args.dtype} input={args.batch}x3x{args.frames}x{args.size}x{args.size} "
            f"best of {args.iters} iters torch={torch.__version__} threads={torch.get_num_threads()}"
        ),
        (
            f"{'variant':44s} {'step s':>8s} {'clips/s':>8s} {'x speed':>8s} {'act MiB':>9s} {'x act':>7s}"
            f" {'TFLOP/s':>8s} {'MFU':>6s} {'peak MiB':>9s}"
        ),
    ]
    base = rows[0]
    for r in rows:
        mfu = f"{100 * r['mfu']:5.1f}%" if r["mfu"] is not None else "   n/a"
        mem = f"{r['peak_mem'] / 2**20:9.0f}" if r["peak_mem"] else "      n/a"
        lines.append(
            f"{r['variant']:44s} {r['step_s']:8.3f} {r['clips_s']:8.3f} {r['clips_s'] / base['clips_s']:8.2f}"
            f" {r['act_bytes'] / 2**20:9.1f} {r['act_bytes'] / base['act_bytes']:7.2f} {r['tflops']:8.3f} {mfu} {mem}"
        )
    lines.append("(x speed, x act: relative to the first row; train FLOPs = 3 x forward FLOPs from model_flops)")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=PRECISIONS)
    p.add_argument("--models", nargs="+", default=["vit_base_patch16_224"])
    p.add_argument("--backends", nargs="+", default=["sdpa", "eager"], choices=["flash", "sdpa", "eager"])
    p.add_argument("--embeds", nargs="+", default=["linear", "conv"], choices=["linear", "conv"])
    p.add_argument(
        "--grid", action="store_true", help="every backend x embed combination (default: one factor at a time)"
    )
    p.add_argument("--embed-iters", type=int, default=10, help="iterations of the embedding-only comparison (0: skip)")
    p.add_argument("--no-ckpt", dest="ckpt", action="store_false", help="skip the activation-checkpointing row")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: table by GPU name)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.embed_iters > 0:
        print(embed_only(args), flush=True)
    print(report(run(args), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

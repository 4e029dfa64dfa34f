"""Memory benchmarks: activation bytes with vs without checkpointing, planner predictions vs
measurement per size, and (CUDA) training-step peaks, largest micro-batch under a cap, ViT-g with
ZeRO-3 offload, and flash vs sdpa throughput/MFU.

Parts (``--parts``, comma separated):
  ratio       activation bytes/clip of vit_base_patch16_224 with vs without checkpointing (target <= 0.35x)
  activations predicted (analytic formula) vs measured (saved tensors) activation bytes per size
  throughput  CUDA: ViT-B/L train-step clips/s and MFU, flash vs sdpa
  capacity    CUDA: largest micro-batch per size under ``--cap`` (torch.cuda.set_per_process_memory_fraction),
              predicted vs measured; every probe's measured peak vs the planner's allocated_peak
  giant       CUDA: ViT-g training with ZeRO-3 param+optimizer offload + checkpointing under the cap
  offload     layer-streaming inference (ZeRO-3 parameter offload to CPU): eval clips/s (and CUDA peak
              memory) vs the plain model for several stage3_max_live_parameters values; same logits
  rss         CPU, 2 ranks: per-rank host RSS (anon / file) after build, pretrained load and
              deepspeed.initialize (no optimizer), --rss-modes before (full build) / after (zero.Init)
  optimizer   CPU, 2 ranks: ZeRO-3 + AdamW per-rank RSS after one step vs 16 B x params / world
              (--export-after-optimizer: then the streamed `avion-ds export` peak RSS vs fp32 bytes)
  export      CPU, 2 ranks: ZeRO-3 checkpoint (--export-optimizers adamw:1 / sgd:0) of --export-models, then
              the streamed `avion-ds export` peak RSS (fresh process) vs fp32 bytes and the output verified
  resident    ZeRO-3 param offload: peak parameter elements resident during forward per --offload-live
  train       CPU, 2 ranks: the training command's ZeRO-3 construction (ds_configs/zero3.json, JSON AdamW) of
              --optimizer-model in fp32 and bf16: per-rank peak RSS of build and of parallelize (up to and
              through deepspeed.initialize) vs fp32 bytes
  (rss / optimizer / export / resident / train live in bench/memory_large.py)

Examples:
  python bench/memory.py --parts ratio,activations --dtype fp32 --depth 2 --json out/memory_cpu.json
  python bench/memory.py --device cuda --parts throughput --json out/throughput.json
  python bench/memory.py --device cuda --parts capacity,giant --cap 24GiB --json out/capacity.json
  python bench/memory.py --parts rss --rss-models vit_giant_patch14_224 --rss-modes after --json out/rss_g.json
  python bench/memory.py --parts export --export-models vit_giant_patch14_224 --export-optimizers sgd:0 \
      --rss-frames 2 --rss-size 112 --export-load-back --json out/export_g.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.memory.estimate import (
    activation_bytes_per_clip,
    arch_info,
    as_dtype,
    estimate,
)
from avion_ds.memory.units import format_bytes, parse_bytes
from avion_ds.models import create_model

SIZES = (
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "vit_large_patch16_224",
    "vit_huge_patch16_224",
    "vit_giant_patch14_224",
)
MiB = 2**20


def _model(
    name: str, frames: int, size: int, depth: int, device: str, dtype: torch.dtype, **kw: Any
) -> torch.nn.Module:
    over = dict(num_frames=frames, img_size=size, **kw)
    if depth:
        over["depth"] = depth
    with torch.device("meta"):
        m = create_model(name, **over)
    m = m.to_empty(device=device)  # saved bytes do not depend on weight values
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return m.to(dtype)


def part_ratio(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    m = _model("vit_base_patch16_224", args.frames, args.size, 0, args.device, dtype)
    t0 = time.perf_counter()
    full = measure_activation_bytes(m, (args.frames, args.size, 1))
    ckpt = measure_activation_bytes(m, (args.frames, args.size, 1), checkpointing=True)
    ratio = ckpt / full
    print(
        f"[ratio] vit_base_patch16_224 {args.frames}x{args.size} {str(dtype)[6:]} activations/clip: "
        f"no checkpointing {format_bytes(full)}, checkpoint every block {format_bytes(ckpt)} -> "
        f"{ratio:.3f}x (target <= 0.35x) [{time.perf_counter() - t0:.0f} s]"
    )
    return {
        "model": "vit_base_patch16_224",
        "frames": args.frames,
        "size": args.size,
        "dtype": str(dtype)[6:],
        "bytes_no_ckpt": full,
        "bytes_ckpt": ckpt,
        "ratio": ratio,
    }


def part_activations(args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, Any]]:
    rows = []
    print(
        f"[activations] predicted vs measured bytes/clip, {args.frames}x{args.size}, {str(dtype)[6:]}, "
        f"depth {'full' if not args.depth else args.depth}"
    )
    for name in args.sizes:
        frames, size = args.frames, args.size - args.size % arch_info(name).patch_size
        m = _model(name, frames, size, args.depth, args.device, dtype)
        info = arch_info(m)
        for ck in (False, 1):
            measured = measure_activation_bytes(m, (frames, size, 1), checkpointing=ck)
            predicted = activation_bytes_per_clip(info, frames, size, dtype, ck)
            full_depth = activation_bytes_per_clip(arch_info(name, frames, size), frames, size, dtype, ck)
            err = predicted / measured - 1
            rows.append(
                {
                    "model": name,
                    "frames": frames,
                    "size": size,
                    "depth": info.depth,
                    "checkpointing": bool(ck),
                    "measured": measured,
                    "predicted": predicted,
                    "error": err,
                    "predicted_full_depth": full_depth,
                }
            )
            print(
                f"  {name:24s} depth {info.depth:2d} ckpt={'yes' if ck else 'no ':3s} measured {format_bytes(measured):>11s} "
                f"predicted {format_bytes(predicted):>11s} error {err:+.2%}   (full depth predicted "
                f"{format_bytes(full_depth)})"
            )
        del m
    return rows


def part_throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    from avion_ds.engine.memory_probe import train_step_probe
    from avion_ds.models.attention import flash_available

    rows = []
    for name, micro in (("vit_base_patch16_224", 16), ("vit_large_patch16_224", 8)):
        for backend in ("flash", "sdpa"):
            if backend == "flash" and not flash_available():
                rows.append({"model": name, "attn_backend": "flash", "error": "flash-attn not installed"})
                print(f"[throughput] {name} flash: flash-attn not installed")
                continue
            r = train_step_probe(
                name, args.frames, args.size, micro, dtype="bf16", attn_backend=backend, warmup=2, steps=5
            )
            rows.append(r)
            if r.get("clips_per_s"):
                print(
                    f"[throughput] {name} {backend}: micro {micro}, {r['clips_per_s']:.1f} clips/s, "
                    f"{r['achieved_tflops']:.0f} TFLOPS, MFU {r['mfu'] or 0:.1%}, peak {format_bytes(r['peak_allocated'])}"
                )
            else:
                print(f"[throughput] {name} {backend}: {r}")
    return rows


def _probe_vs_estimate(
    name: str,
    args: argparse.Namespace,
    micro: int,
    ckpt: int,
    ds: dict | None = None,
    stage: int = 0,
    off: bool = False,
) -> dict[str, Any]:
    from avion_ds.distributed.ds_plan import DSPlan
    from avion_ds.engine.memory_probe import train_step_probe
    from avion_ds.memory.plan import live_window

    r = train_step_probe(
        name, args.frames, args.size, micro, ds, dtype="bf16", checkpoint_every=ckpt, warmup=1, steps=2
    )
    window = live_window(DSPlan.of(ds))  # the probe's ZeRO-3 window, as the planner counts its config's
    e = estimate(name, args.frames, args.size, micro, "bf16", stage, off, off, ckpt, 1, **window)
    r["predicted_allocated"] = e.allocated_peak
    if r.get("peak_allocated"):
        r["planner_error"] = e.allocated_peak / r["peak_allocated"] - 1
    return r


def part_capacity(args: argparse.Namespace) -> dict[str, Any]:
    from avion_ds.memory.estimate import FRAGMENTATION

    cap = args.cap_bytes
    out: dict[str, Any] = {"cap": cap, "max_micro": [], "probes": []}
    for name in args.capacity_sizes:
        for ckpt in (0, 1):
            pred = 0
            for m in range(1, 257):
                e = estimate(name, args.frames, args.size, m, "bf16", 0, False, False, ckpt, 1)
                if e.allocated_peak * (1 + FRAGMENTATION) > cap:
                    break
                pred = m
            tried: dict[int, bool] = {}
            m = max(pred, 1)
            while m not in tried and 1 <= m <= 256 and len(tried) < 3:
                r = _probe_vs_estimate(name, args, m, ckpt)
                out["probes"].append(r)
                tried[m] = not r.get("oom") and "clips_per_s" in r
                m = m + 1 if tried[m] else m - 1
            ok = [k for k, v in tried.items() if v]
            measured = max(ok) if ok else 0
            out["max_micro"].append(
                {"model": name, "checkpoint_every": ckpt, "predicted": pred, "measured": measured, "probes": tried}
            )
            print(
                f"[capacity] {name} ckpt={'every 1' if ckpt else 'none'} under {format_bytes(cap)}: largest micro-batch "
                f"predicted {pred}, measured {measured}"
            )
            args.save_partial("capacity", out)  # a time limit mid-part keeps what was measured
    errs = [p["planner_error"] for p in out["probes"] if "planner_error" in p]
    if errs:
        print(
            f"[capacity] planner allocated-peak error over {len(errs)} probes: "
            f"max |err| {max(abs(e) for e in errs):.1%}, mean {sum(errs) / len(errs):+.1%} (target within +-10%)"
        )
    return out


def part_giant(args: argparse.Namespace) -> list[dict[str, Any]]:
    from avion_ds.memory.plan import Candidate, ds_config_for

    rows = []
    for micro in (1, 2):
        ds = ds_config_for(Candidate(3, "all", "cpu", 1, micro, 1))
        r = _probe_vs_estimate("vit_giant_patch14_224", args, micro, 1, ds, stage=3, off=True)
        rows.append(r)
        print(
            f"[giant] ViT-g ZeRO-3 offload(all:cpu) + checkpointing micro {micro} under {format_bytes(args.cap_bytes)}: "
            + (
                f"{r['clips_per_s']:.2f} clips/s, peak {format_bytes(r['peak_allocated'])}, predicted "
                f"{format_bytes(r['predicted_allocated'])}"
                if r.get("clips_per_s")
                else str(r)
            )
        )
    return rows


def part_offload(args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, Any]]:
    from avion_ds.memory.offload import wrap_for_inference

    name, rows = args.offload_model, []
    cuda = args.device == "cuda"
    x = torch.randn(args.offload_batch, 3, args.frames, args.size, args.size, dtype=dtype, device=args.device)

    def timed(fn: Any) -> tuple[float, Any]:
        out = fn(x)  # warm-up (and ZeRO-3 trace)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.offload_iters):
            out = fn(x)
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.offload_iters, out

    torch.manual_seed(0)
    plain = create_model(name, num_frames=args.frames, img_size=args.size).eval().to(args.device, dtype)
    params = sum(p.numel() for p in plain.parameters())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        t_plain, ref = timed(plain)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    rows.append(
        {
            "model": name,
            "mode": "plain",
            "params": params,
            "step_s": t_plain,
            "clips_per_s": args.offload_batch / t_plain,
            "peak_allocated": peak,
        }
    )
    state = {k: v.detach().cpu() for k, v in plain.state_dict().items()}
    del plain
    print(
        f"[offload] {name} {args.frames}x{args.size} batch {args.offload_batch} {str(dtype)[6:]}: plain "
        f"{args.offload_batch / t_plain:.2f} clips/s" + (f", peak {format_bytes(peak)}" if cuda else "")
    )
    for live in args.offload_live:
        m = create_model(name, num_frames=args.frames, img_size=args.size)
        m.load_state_dict(state, strict=False)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        off = wrap_for_inference(
            m, offload="cpu", max_live_parameters=live, prefetch_bucket_size=max(live // 2, 1), dtype=dtype
        )
        t, out = timed(off)
        peak = torch.cuda.max_memory_allocated() if cuda else None
        diff = float((out.float().cpu() - ref.float().cpu()).abs().max())
        rows.append(
            {
                "model": name,
                "mode": "zero3-offload-cpu",
                "max_live_parameters": live,
                "params": params,
                "step_s": t,
                "clips_per_s": args.offload_batch / t,
                "peak_allocated": peak,
                "max_abs_diff": diff,
                "slowdown": t / t_plain,
            }
        )
        print(
            f"[offload]   max_live_parameters {live:>11,d}: {args.offload_batch / t:.2f} clips/s ({t / t_plain:.2f}x "
            f"the plain time)" + (f", peak {format_bytes(peak)}" if cuda else "") + f", max |logit diff| {diff:.1e}"
        )
        del off, m
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="ratio,activations")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--depth", type=int, default=0, help="0 = full depth; k = depth-k copies (CPU: cheaper)")
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument(
        "--capacity-sizes",
        default="vit_small_patch16_224,vit_base_patch16_224,vit_large_patch16_224,vit_huge_patch16_224",
    )
    p.add_argument("--cap", default="24GiB", help="CUDA memory cap for capacity/giant")
    p.add_argument("--offload-model", default="vit_base_patch16_224")
    p.add_argument("--offload-batch", type=int, default=2)
    p.add_argument("--offload-iters", type=int, default=2)
    p.add_argument(
        "--offload-live", default="1000000,10000000,100000000", help="stage3_max_live_parameters values to compare"
    )
    p.add_argument("--rss-models", default="vit_huge_patch16_224,vit_giant_patch14_224")
    p.add_argument("--rss-modes", default="after,before", help="after = zero.Init build; before = full build")
    p.add_argument("--rss-frames", type=int, default=16)
    p.add_argument("--rss-size", type=int, default=224)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--optimizer-model", default="vit_large_patch16_224")
    p.add_argument(
        "--export-after-optimizer",
        action="store_true",
        help="optimizer part: save the ZeRO-3 checkpoint and measure the streamed export's peak RSS",
    )
    p.add_argument("--export-models", default="vit_giant_patch14_224")
    p.add_argument(
        "--export-optimizers",
        default="sgd:0",
        help="OPT:STEPS list: adamw:1 (AdamW, one step) / sgd:0 (SGD without momentum, no step)",
    )
    p.add_argument(
        "--export-load-back",
        action="store_true",
        help="export part: also load the output with create_model(pretrained=...) (full model in memory)",
    )
    p.add_argument("--work-dir", default="/tmp/avion_bench_rss", help="weights files and per-run JSON")
    p.add_argument("--keep-weights", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.rss_models = [s for s in args.rss_models.split(",") if s]
    args.rss_modes = [s for s in args.rss_modes.split(",") if s]
    args.export_models = [s for s in args.export_models.split(",") if s]
    args.export_optimizers = [s for s in args.export_optimizers.split(",") if s]
    bad = [
        s
        for s in args.export_optimizers
        if s.partition(":")[0] not in ("adamw", "sgd") or not s.partition(":")[2].isdigit()
    ]
    if bad:
        p.error(f"--export-optimizers {bad[0]!r}: use OPT:STEPS with OPT adamw or sgd, e.g. adamw:1,sgd:0")
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.capacity_sizes = [s for s in args.capacity_sizes.split(",") if s]
    args.cap_bytes = parse_bytes(args.cap, "--cap")
    args.offload_live = [int(float(v)) for v in args.offload_live.split(",") if v]
    parts = [s for s in args.parts.split(",") if s]
    dtype = as_dtype(args.dtype)
    cuda_parts = {"throughput", "capacity", "giant"} & set(parts)
    if cuda_parts and not torch.cuda.is_available():
        print(f"bench/memory.py: parts {sorted(cuda_parts)} need CUDA; none visible", file=sys.stderr)
        return 2
    if {"capacity", "giant"} & set(parts):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total))
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name()
            if args.device == "cuda"
            else platform.processor() or platform.machine(),
        },
        "command": " ".join(["python", "bench/memory.py"] + (argv or sys.argv[1:])),
    }

    def save(part: str | None = None, partial: Any = None) -> None:
        if part is not None:
            results[part] = partial
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")

    args.save_partial = save
    for part in parts:
        t0 = time.perf_counter()
        if part == "ratio":
            results["ratio"] = part_ratio(args, dtype)
        elif part == "activations":
            results["activations"] = part_activations(args, dtype)
        elif part == "throughput":
            results["throughput"] = part_throughput(args)
        elif part == "capacity":
            results["capacity"] = part_capacity(args)
        elif part == "giant":
            results["giant"] = part_giant(args)
        elif part == "offload":
            results["offload"] = part_offload(args, dtype)
        elif part in ("rss", "optimizer", "export", "resident", "train"):
            import memory_large

            results[part] = getattr(memory_large, f"part_{part}")(args)
        else:
            print(f"bench/memory.py: unknown part {part!r}", file=sys.stderr)
            return 2
        results.setdefault("seconds", {})[part] = time.perf_counter() - t0
        save()
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

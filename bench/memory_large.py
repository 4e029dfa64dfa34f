"""Large-model parts of bench/memory.py (CPU, 2 ranks): per-rank host RSS of ZeRO-3 build / load /
initialize before vs after partitioned construction, ZeRO-3 + Adam per-rank RSS against the
planner's formula, and parameters resident during ``eval --offload`` forward.

  rss        per model in --rss-models and mode in --rss-modes: 2 ranks (torchrun) of
             ``python -m bench.rss``; weights written first (safetensors, tensor by tensor)
  optimizer  ViT-L (--optimizer-model) ZeRO-3 + AdamW, one step: per-rank RSS vs 16 B x params / world
  export     per --export-models and --export-optimizers (``adamw:1`` = AdamW, one step; ``sgd:0`` =
             client SGD without momentum, saved right after initialize): a ZeRO-3 checkpoint written by
             DeepSpeed (weights loaded from a random file first), then ``avion-ds export`` in a fresh
             process (peak RSS anon / file vs fp32 bytes), then the output checked (shapes; equal to the
             weights when no step was taken; --export-load-back: through create_model(pretrained=...))
  resident   ZeRO-3 param offload (``build_for_inference``): peak resident parameter elements during
             forward for each --offload-live value (prefetch bucket = live / 2), next to the model size
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from avion_ds.distributed.dist import free_port
from avion_ds.memory.units import format_bytes

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # bench.rss, also in the subprocesses (PYTHONPATH)
    sys.path.insert(0, str(REPO))
ZERO3_DEFAULT_REDUCE_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default (elements)


def _free_gib() -> float:
    with open("/proc/meminfo") as f:
        info = {ln.split(":")[0]: int(ln.split()[1]) for ln in f}
    return info["MemAvailable"] / 2**20


def _rss_run(
    model: str,
    mode: str,
    weights: Path | None,
    out: Path,
    args: argparse.Namespace,
    optimizer: bool = False,
    save: Path | None = None,
    sgd: bool = False,
    steps: int = 1,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(args.ranks),
        "--master_port",
        str(free_port()),
        "-m",
        "bench.rss",
        "--model",
        model,
        "--mode",
        mode,
        "--out",
        str(out),
        "--frames",
        str(args.rss_frames),
        "--size",
        str(args.rss_size),
    ]
    if weights is not None:
        cmd += ["--pretrained", str(weights)]
    if optimizer:
        cmd += ["--optimizer", "--steps", str(steps)] + (["--sgd"] if sgd else [])
    if save is not None:
        cmd += ["--save", str(save)]
    cmd += list(extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.is_file():
        return {"model": model, "mode": mode, "error": proc.stderr[-1500:]}
    return json.loads(out.read_text())


def _print_rss(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"[rss] {r['model']} {r['mode']}: FAILED\n{r['error']}")
        return
    fp = r["fp32_bytes"]
    for rank in r["ranks"]:
        cells = " | ".join(
            f"{s} anon {d['peak_anon'] / fp:.2f}x file {d['peak_file'] / fp:.2f}x total {d['peak_total'] / fp:.2f}x"
            for s, d in rank["stages"].items()
        )
        print(
            f"[rss] {r['model']} ({r['params'] / 1e6:.0f}M, fp32 {format_bytes(fp)}) {r['mode']:6s} rank {rank['rank']}: {cells}"
        )


def part_train(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The training command's ZeRO-3 construction of --optimizer-model in fp32 and bf16 (bench.rss
    --train-path): per-rank peaks of build and of parallelize (deepspeed.initialize included)."""
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for precision in ("fp32", "bf16"):
        out = work / f"rss_train_{precision}.json"
        r = _rss_run(args.optimizer_model, "after", None, out, args, extra=("--train-path", precision))
        _print_rss(r)
        rows.append(r)
    return rows


def part_rss(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.rss import write_random_weights

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.rss_models:
        weights = work / f"{model}.safetensors"
        if not weights.is_file():
            write_random_weights(model, weights, num_frames=args.rss_frames, img_size=args.rss_size)
        for mode in args.rss_modes:
            need = (2.2 if mode == "before" else 0.7) * args.ranks * weights.stat().st_size / 2**30 + 2
            if _free_gib() < need:
                rows.append({"model": model, "mode": mode, "skipped": f"needs ~{need:.0f} GiB, {_free_gib():.0f} free"})
                print(f"[rss] {model} {mode}: skipped ({rows[-1]['skipped']})")
                continue
            r = _rss_run(model, mode, weights, work / f"rss_{model}_{mode}.json", args)
            _print_rss(r)
            rows.append(r)
        if not args.keep_weights:
            weights.unlink(missing_ok=True)
    return rows


def part_optimizer(args: argparse.Namespace) -> dict[str, Any]:
    """ZeRO-3 + AdamW fp32 after one step: per-rank growth vs 16 B x params / world (+ live window)."""
    from avion_ds.memory.estimate import ZERO3_FP32_EXTRA_BYTES

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "optimizer_run" if args.export_after_optimizer else None
    r = _rss_run(args.optimizer_model, "after", None, work / "rss_optimizer.json", args, optimizer=True, save=run_dir)
    _print_rss(r)
    if "error" in r:
        return r
    p, w = r["params"], r["world_size"]
    textbook = 16 * p // w  # fp32 params + grads + Adam moments, partitioned
    bucket = 4 * min(ZERO3_DEFAULT_REDUCE_BUCKET, p)  # contiguous-gradient bucket (DeepSpeed default size)
    planner = (16 + ZERO3_FP32_EXTRA_BYTES) * p // w + bucket
    for rank in r["ranks"]:
        held = rank["stages"]["step"]["now_total"]  # what stays after the step, above the baseline
        rank.update(
            textbook_bytes=textbook,
            bucket_bytes=bucket,
            planner_bytes=planner,
            held_over_textbook=held / textbook,
            held_over_planner=held / planner,
        )
        print(
            f"[optimizer] {args.optimizer_model} rank {rank['rank']}: held after step {format_bytes(held)}: "
            f"{held / textbook:.3f}x of 16 B x p / world ({format_bytes(textbook)}), {held / planner:.3f}x of the "
            f"planner's 21 B x p / world + 4 B x min(5e8, p) ({format_bytes(planner)})"
        )
    if run_dir is not None:
        r["export"] = _export_rss(run_dir, work / "exported.safetensors", r["fp32_bytes"])
    return r


def _in_fresh_process(code: str, *argv: str) -> Any:
    """Run ``code`` (which prints ``RESULT <json>``) in a new interpreter; the parsed JSON or None."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        print(f"FAILED\n{proc.stderr[-1500:]}")
        return None
    return json.loads(line[7:])


def part_export(args: argparse.Namespace) -> list[dict[str, Any]]:
    """ZeRO-3 checkpoint per (model, optimizer) -> streamed export RSS -> output verified."""
    from bench.rss import write_random_weights

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    kw = {"num_frames": args.rss_frames, "img_size": args.rss_size}
    rows = []
    for model in args.export_models:
        weights = work / f"{model}.safetensors"
        if not weights.is_file():
            write_random_weights(model, weights, **kw)
        fp32_gib = weights.stat().st_size / 2**30
        for spec in args.export_optimizers:
            opt, steps = spec.split(":")
            need = 2.0 * args.ranks * fp32_gib + 2  # ~1.7x per rank measured after initialize (ViT-B)
            if _free_gib() < need:
                rows.append(
                    {"model": model, "optimizer": spec, "skipped": f"needs ~{need:.0f} GiB, {_free_gib():.0f} free"}
                )
                print(f"[export] {model} {spec}: skipped ({rows[-1]['skipped']})")
                continue
            run_dir, out = work / f"export_run_{opt}{steps}", work / f"exported_{opt}{steps}.safetensors"
            r = _rss_run(
                model,
                "after",
                weights,
                work / f"rss_export_{opt}{steps}.json",
                args,
                optimizer=True,
                save=run_dir,
                sgd=opt == "sgd",
                steps=int(steps),
            )
            if "error" in r:
                print(f"[export] {model} {spec}: checkpoint FAILED\n{r['error']}")
                rows.append(r)
                continue
            shards = sorted(run_dir.rglob("*optim_states.pt"))
            row = {
                "model": model,
                "optimizer": spec,
                "params": r["params"],
                "fp32_bytes": r["fp32_bytes"],
                "world_size": r["world_size"],
                "optim_shard_bytes": sum(f.stat().st_size for f in shards),
                "checkpoint_rss": r["ranks"],
            }
            row["export"] = _export_rss(run_dir, out, r["fp32_bytes"], keep=True)
            print(
                f"[export] {model} {spec}: {len(shards)} optimizer shards, "
                f"{row['optim_shard_bytes'] / r['fp32_bytes']:.2f}x fp32 bytes on disk"
            )
            if "error" not in row["export"]:
                ref = str(weights) if int(steps) == 0 else ""
                row["verify"] = _in_fresh_process(
                    "import json, sys; from bench.rss import verify_export; "
                    "print('RESULT ' + json.dumps(verify_export(sys.argv[1], sys.argv[2], sys.argv[3] or None, "
                    "sys.argv[4] == '1', num_frames=int(sys.argv[5]), img_size=int(sys.argv[6]))))",
                    str(out),
                    model,
                    ref,
                    "1" if args.export_load_back else "0",
                    str(args.rss_frames),
                    str(args.rss_size),
                )
                print(f"[export] {model} {spec}: output check {row['verify']}")
            out.unlink(missing_ok=True)
            shutil.rmtree(run_dir, ignore_errors=True)
            rows.append(row)
        if not args.keep_weights:
            weights.unlink(missing_ok=True)
    return rows


def _export_rss(run_dir: Path, out: Path, fp32: int, keep: bool = False) -> dict[str, Any]:
    """`avion-ds export` of the ZeRO-3 checkpoint in a fresh process: peak RSS vs fp32 model bytes."""
    code = (
        "import json, sys; from bench.rss import measure_export; "
        "print('RESULT ' + json.dumps(measure_export(sys.argv[1], sys.argv[2])))"
    )
    peaks = _in_fresh_process(code, str(run_dir), str(out))
    if peaks is None:
        return {"error": "export failed"}
    peaks["fp32_bytes"] = fp32
    print(
        f"[export] streamed export of the ZeRO-3 checkpoint: peak RSS {peaks['peak_total'] / fp32:.2f}x of fp32 "
        f"({format_bytes(peaks['peak_total'])}; anon {peaks['peak_anon'] / fp32:.2f}x, file-backed "
        f"{peaks['peak_file'] / fp32:.2f}x), output {format_bytes(out.stat().st_size)}"
    )
    if not keep:
        out.unlink(missing_ok=True)
    return peaks


def part_resident(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs itself in a subprocess (one rank) so the DeepSpeed engines do not stay in this process."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    cmd = [
        sys.executable,
        __file__,
        "--resident-worker",
        args.offload_model,
        str(args.frames),
        str(args.size),
        ",".join(str(v) for v in args.offload_live),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        print(f"[resident] FAILED\n{proc.stderr[-1500:]}")
        return [{"error": proc.stderr[-1500:]}]
    rows = json.loads(line[7:])
    for r in rows:
        print(
            f"[resident] {r['model']} ({r['params'] / 1e6:.1f}M params): max_live {r['max_live_parameters']:>11,d} + "
            f"prefetch {r['prefetch_bucket_size']:>11,d}: peak resident {r['peak_resident']:>11,d} "
            f"({r['peak_resident'] / r['params']:.3f} of the model; largest module {r['largest_module']:,d})"
        )
    return rows


def _resident_worker(model: str, frames: int, size: int, lives: list[int]) -> None:
    from avion_ds.memory.offload import resident_peaks

    print("RESULT " + json.dumps(resident_peaks(model, frames, size, lives)), flush=True)
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--resident-worker":
        _resident_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), [int(v) for v in sys.argv[5].split(",")])
    raise SystemExit("run through bench/memory.py --parts rss,optimizer,resident")

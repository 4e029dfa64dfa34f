"""`avion-ds plan`: pick ZeRO stage / offload / checkpointing / micro-batch for a GPU budget
(the search and its model: :mod:`avion_ds.memory.plan`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from avion_ds.cli.args import Parser
from avion_ds.engine.memory_probe import measure_candidates
from avion_ds.memory.plan import (
    HW_FIELDS,
    Candidate,
    Hardware,
    Request,
    _overrides_yaml,
    ds_config_for,
    explain_impossible,
    format_table,
    recipe_overrides,
)
from avion_ds.memory.plan_tokens import plan_fewer_tokens
from avion_ds.memory.units import format_bytes, parse_bytes
from avion_ds.models import registered_arch


class _Parser(Parser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"avion-ds plan: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _positive_int(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}={text!r} is not an integer") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name}={value} must be positive")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="avion-ds plan", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="registered model name (avion_ds.models.list_models())")
    p.add_argument(
        "--config",
        default=None,
        help="a recipe instead of --model: its model, frames and size, and its task's own step memory "
        "(task: umt counts the frozen teacher and the visible tokens)",
    )
    p.add_argument("--frames", type=_positive_int("--frames"), default=16, help="clip length in frames")
    p.add_argument("--size", type=_positive_int("--size"), default=224, help="input size in pixels (square)")
    p.add_argument("--gpu-mem", required=True, help="memory per GPU with a unit, e.g. 24GiB or 80GB")
    p.add_argument("--gpus", type=_positive_int("--gpus"), default=1, help="world size (total GPUs)")
    p.add_argument(
        "--gpus-per-node",
        type=_positive_int("--gpus-per-node"),
        default=None,
        help="GPUs per node (default: all on one node)",
    )
    p.add_argument("--cpu-mem", default=None, help="host memory per node with a unit (checked for offload)")
    p.add_argument(
        "--global-batch",
        type=_positive_int("--global-batch"),
        default=None,
        help="global batch the plan must reach (default: micro-batch x GPUs)",
    )
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"), help="training precision")
    p.add_argument("--nvme-path", default=None, help="also consider ZeRO-3 NVMe offload to this directory")
    p.add_argument(
        "--max-micro-batch", type=_positive_int("--max-micro-batch"), default=64, help="largest micro-batch to consider"
    )
    p.add_argument(
        "--out",
        default=None,
        help="DeepSpeed JSON to write, recipe overrides next to it (.overrides.yaml); not into ds_configs/, "
        "whose files the tests build as shipped; default: nothing written, the config printed",
    )
    p.add_argument("--top", type=_positive_int("--top"), default=12, help="rows of the table")
    p.add_argument(
        "--may-merge-tokens",
        action="store_true",
        help="when nothing fits, the plan may turn on token merging (model.token_merge; it changes the model's "
        "outputs): the recipe key model.plan_may_merge_tokens with --config",
    )
    p.add_argument(
        "--may-drop-patches",
        action="store_true",
        help="when nothing fits (token merging first, if allowed), the plan may turn on patch dropout in training "
        "(model.patch_dropout; it changes what the model sees): the recipe key model.plan_may_drop_patches",
    )
    p.add_argument("--measure", action="store_true", help="CUDA only: run real steps of the top candidates")
    p.add_argument(
        "--measure-top",
        type=_positive_int("--measure-top"),
        default=3,
        help="with --measure: how many top candidates to run",
    )
    p.add_argument(
        "--measure-steps",
        type=_positive_int("--measure-steps"),
        default=3,
        help="with --measure: steps timed per candidate",
    )
    for f in HW_FIELDS:
        p.add_argument(
            "--" + f.replace("_", "-"),
            type=float,
            default=getattr(Hardware(), f),
            help=f"cost model: {f} (default {getattr(Hardware(), f)})",
        )
    return p.parse_args(argv)


def build_request(args: argparse.Namespace) -> Request:
    """Validate the command line into a Request; ValueError (one line, naming the value) otherwise."""
    estimator = None
    if args.config is not None:
        from avion_ds.tasks import load_recipe, task_of  # lazy: every task and dataset registers

        recipe = load_recipe(args.config)
        args.model, args.frames, args.size = recipe.model.name, recipe.data.num_frames, recipe.data.size
        task = task_of(recipe)
        estimator = task.memory_estimator(recipe)
        if estimator is not None and args.measure:
            raise ValueError(
                f"--measure with --config {args.config}: the probe times a classifier's step, not task: "
                f"{task.name}'s; drop --measure for the predicted plan"
            )
    elif args.model is None:
        raise ValueError("--model or --config is required")
    arch = registered_arch(args.model)  # unknown model -> ValueError with close matches
    if args.frames % arch.tubelet_size:
        raise ValueError(
            f"--frames {args.frames} is not divisible by the tubelet size {arch.tubelet_size} of {args.model}"
        )
    if args.size % arch.patch_size:
        raise ValueError(f"--size {args.size} is not divisible by the patch size {arch.patch_size} of {args.model}")
    gpu_mem = parse_bytes(args.gpu_mem, "--gpu-mem")
    if gpu_mem <= 0:
        raise ValueError(f"--gpu-mem={args.gpu_mem!r} must be positive")
    cpu_mem = parse_bytes(args.cpu_mem, "--cpu-mem") if args.cpu_mem is not None else None
    if args.global_batch is not None and args.global_batch % args.gpus:
        raise ValueError(f"--global-batch {args.global_batch} is not divisible by --gpus {args.gpus}")
    if not 0.0 <= args.overlap <= 1.0 or args.mfu <= 0 or args.mfu > 1:
        raise ValueError(f"--overlap={args.overlap} must be in [0, 1] and --mfu={args.mfu} in (0, 1]")
    for f in ("gpu_tflops", "pcie_gbps", "net_gbps", "nvme_gbps", "cpu_adam_gparams"):
        if getattr(args, f) <= 0:
            raise ValueError(f"--{f.replace('_', '-')}={getattr(args, f)} must be positive")
    if args.stage3_overhead < 0:
        raise ValueError(f"--stage3-overhead={args.stage3_overhead} must be >= 0")
    hw = Hardware(**{f: getattr(args, f) for f in HW_FIELDS})
    return Request(
        args.model,
        args.frames,
        args.size,
        gpu_mem,
        args.gpus,
        args.gpus_per_node or min(args.gpus, 8),
        cpu_mem,
        args.global_batch,
        args.dtype,
        args.nvme_path,
        args.max_micro_batch,
        hw,
        estimator,
    )


def token_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the plan may change and what the model already does to its tokens (``--config``'s
    ``model.plan_may_merge_tokens`` / ``model.token_merge`` / ``model.plan_may_drop_patches`` /
    ``model.patch_dropout``, ``model.rlt_threshold``; ``--may-merge-tokens`` / ``--may-drop-patches``):
    ``plan_fewer_tokens``'s keywords."""
    out: dict[str, Any] = {"may_merge": bool(args.may_merge_tokens), "may_drop": bool(args.may_drop_patches)}
    if getattr(args, "config", None) is None:
        return out
    from avion_ds.tasks import load_recipe  # lazy: every task and dataset registers

    m = load_recipe(args.config).model
    out["may_merge"] = out["may_merge"] or m.plan_may_merge_tokens
    out["may_drop"] = out["may_drop"] or m.plan_may_drop_patches
    return {**out, "token_merge": m.token_merge, "patch_dropout": m.patch_dropout, "rlt": bool(m.rlt_threshold)}


def write_outputs(best: Candidate, req: Request, out: Path) -> tuple[Path, Path, list[str]]:
    """Write the DeepSpeed JSON and the recipe-override YAML; return their paths and the --set list."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ds_config_for(best, req.nvme_path), indent=2) + "\n")
    sets = recipe_overrides(best, req)
    yml = out.with_suffix(".overrides.yaml")
    header = f"# avion-ds plan: {best.label}; predicted peak {format_bytes(best.peak)} per GPU\n"
    yml.write_text(header + _overrides_yaml(sets))
    return out, yml, sets


def main(argv: list[str] | None = None) -> int:
    """Entry point of `avion-ds plan`; returns 0 (a plan written), 1 (nothing fits), 2 (bad input)."""
    args = parse_args(argv)
    try:
        req = build_request(args)
        if args.measure and not torch.cuda.is_available():
            raise ValueError("--measure needs a CUDA GPU and none is visible; drop --measure for the predicted plan")
    except ValueError as e:
        print(f"avion-ds plan: error: {e}", file=sys.stderr)
        return 2
    cands, facts = plan_fewer_tokens(req, **token_settings(args))
    fitting = [c for c in cands if c.fits]
    if facts.get("merged_by_planner"):
        print(
            f"nothing fits without token merging: the plan merges {facts['token_merge']} tokens after every block "
            "(model.token_merge; it changes the model's outputs, allowed by model.plan_may_merge_tokens)"
        )
    if facts.get("dropped_by_planner"):
        print(
            f"nothing fits without patch dropout: the plan drops {facts['patch_dropout']:g} of the patches in "
            "training (model.patch_dropout; it changes what the model sees, allowed by model.plan_may_drop_patches)"
        )
    print(
        f"{req.model} {req.frames}x{req.size}: {facts['params'] / 1e6:.1f}M params, {facts['tokens']} tokens/clip, "
        f"{facts['fwd_flops'] / 1e9:.1f} GFLOP fwd/clip; {req.gpus} GPU(s) x {format_bytes(req.gpu_mem)}"
        + (f", host {format_bytes(req.cpu_mem)}/node" if req.cpu_mem else "")
        + (f", global batch {req.global_batch}" if req.global_batch else "")
    )
    hw = req.hw
    print(
        f"{len(fitting)} of {len(cands)} candidates fit; ranked by predicted clips/s (cost model: "
        f"avion_ds.memory.plan.step_time; {hw.gpu_tflops:g} TFLOPS x MFU {hw.mfu:g}, PCIe {hw.pcie_gbps:g} GB/s, "
        f"network {hw.net_gbps:g} GB/s, CPU Adam {hw.cpu_adam_gparams:g} Gparam/s per node; change with --gpu-tflops, "
        f"--pcie-gbps, ...)"
    )
    if not fitting:
        print(explain_impossible(req, cands), file=sys.stderr)
        return 1
    if args.measure:
        measure_candidates(fitting[: args.measure_top], req, steps=args.measure_steps)
        world = tdist.get_world_size() if tdist.is_initialized() else 1
        print(
            f"measured {args.measure_top} candidates on {world} GPU(s), gradient accumulation 1, "
            f"{args.measure_steps} timed steps; clips/s scaled to {req.gpus} GPUs without communication"
            + ("; ZeRO partitions (and so peaks) are those of the measuring world size" if world != req.gpus else "")
        )
        measured = [c for c in fitting[: args.measure_top] if c.measured_clips_per_s]
        if measured:
            top = sorted(measured, key=lambda c: -(c.measured_clips_per_s or 0.0))
            fitting = top + [c for c in fitting if c not in top]
    print(format_table(fitting, args.top))
    best = fitting[0]
    print(f"\nbest: {best.label}, predicted peak {format_bytes(best.peak)}/GPU, {best.clips_per_s:.1f} clips/s")
    if args.out is None:  # nothing lands in the current directory unasked
        sets, out = recipe_overrides(best, req), "PLAN.json"
        print(json.dumps(ds_config_for(best, req.nvme_path), indent=2))
        print(
            f"recipe overrides: {' '.join(sets)}\nnothing written (--out PLAN.json writes the config and the overrides)"
        )
    else:
        out, yml, sets = write_outputs(best, req, Path(args.out))
        print(f"wrote {out} (DeepSpeed config) and {yml} (recipe overrides)")
    nodes = "" if req.gpus <= req.gpus_per_node else " --hostfile HOSTFILE"
    print(
        f"run: deepspeed{nodes} --num_gpus {min(req.gpus, req.gpus_per_node)} launch/train.py --config RECIPE.yaml "
        f"--deepspeed_config {out} " + " ".join(f"--set {s}" for s in sets)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`avion-ds eval`: evaluate a run directory or exported weights; writes the task's metrics JSON.

Checks come first (``engine.run_setup.prepare_eval``, no process group); the evaluation itself is the
recipe's task's (``Task.evaluate``, the same call training makes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from avion_ds.cli.parsers import eval_args as parse_args
from avion_ds.cli.plugins import import_plugins
from avion_ds.config import ConfigError
from avion_ds.data import DeviceAugment, build_loader
from avion_ds.data.errors import DataError
from avion_ds.distributed import dist
from avion_ds.distributed.ds_fields import torch_dtype
from avion_ds.engine.ema import eval_weights
from avion_ds.engine.open_run import OpenedRun, open_run
from avion_ds.engine.run_setup import (
    EvalSetup,
    backends_line,
    prepare_eval,
    seed_everything,
)
from avion_ds.memory.offload import build_for_inference
from avion_ds.tasks import EvalContext, EvalOutcome, load_recipe
from avion_ds.tasks.common.predictions import failed_line


# ---------------------------------------------------------------------------------------------
# standalone evaluation
# ---------------------------------------------------------------------------------------------
def _open(args: argparse.Namespace) -> OpenedRun:
    """The checkpoint to evaluate, through the one run opener (recipe, trust, tag, weights check)."""
    if args.config is None and not (Path(args.checkpoint) / "recipe.yaml").is_file() and Path(args.checkpoint).exists():
        raise ConfigError("--config is required when --checkpoint is not a run directory with recipe.yaml")
    say = (lambda line: print(line, flush=True)) if dist.is_main() else (lambda line: None)
    return open_run(
        args.checkpoint, tag=args.tag, config=args.config, overrides=args.overrides, recipe_of=load_recipe, say=say
    )


def _eval_model(args: argparse.Namespace, setup: EvalSetup, dtype: torch.dtype) -> torch.nn.Module:
    """The model with the checkpoint's weights: plain, or built partitioned for ZeRO-3 offload inference."""
    recipe, task, run_dir = setup.recipe, setup.task, setup.run_dir
    if args.offload != "none":
        # built partitioned under the inference ZeRO-3 config; rank 0 alone reads / consolidates weights

        source: Any = str(args.checkpoint)
        if run_dir is not None:
            source = setup.opened.state_dict() if dist.is_main() else {}
        return build_for_inference(
            lambda: task.build_model(recipe, pretrained=""),
            source,
            offload=args.offload,
            max_live_parameters=int(args.max_live_params),
            prefetch_bucket_size=int(args.prefetch_bucket),
            nvme_path=args.nvme_path,
            dtype=dtype,
            strict=run_dir is not None,
        )
    if run_dir is None:
        return task.build_model(recipe, pretrained=str(args.checkpoint))
    model = task.build_model(recipe, pretrained="")
    setup.opened.load_into(model)
    return model


def offload_line(args: argparse.Namespace) -> str:
    """What ``--offload`` did: where the ZeRO-3 inference engine keeps the parameters, and its limits."""
    where = "CPU memory" if args.offload == "cpu" else f"NVMe ({args.nvme_path})"
    return (
        f"avion-ds eval: ZeRO-3 inference, parameters offloaded to {where}; on the accelerator at most "
        f"{int(args.max_live_params):,} live parameters (--max-live-params), prefetch bucket {int(args.prefetch_bucket):,}"
    )


def _write_results(args: argparse.Namespace, setup: EvalSetup, views: int, out: EvalOutcome) -> None:
    """eval_metrics.json (metrics, the task's report, failed samples, per-sample scores) and the summary lines."""
    run_dir, tag = setup.run_dir, setup.tag
    path = Path(args.out) if args.out else (run_dir or Path(args.checkpoint).parent) / "eval_metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "tag": tag,
        "weights": eval_weights(setup.recipe) if run_dir is not None else "file",
        "split": args.split,
        "num_samples": out.num_samples,
        "views": views,
        "metrics": out.metrics,
        **(out.report or {}),
        "failed_samples": out.failed,
    }
    if out.per_sample is not None and not args.no_per_sample:
        payload["per_sample"] = out.per_sample
    path.write_text(json.dumps(payload) + "\n")
    if out.failed:
        print(failed_line(out.failed), flush=True)
    print(setup.task.eval_line(out.metrics, out.report), flush=True)
    where = (
        f"protocol {payload['protocol']}, {views} views, {payload['num_missing']} missing, "
        f"{payload['num_quarantined']} quarantined, {len(out.failed)} failed to decode; "
        if out.report
        else ""
    )
    print(f"wrote {path} ({out.num_samples} samples evaluated; {where}checkpoint {tag or args.checkpoint})", flush=True)


def setup_eval(args: argparse.Namespace) -> EvalSetup:
    """Every check before the process group: ``--plugin`` imports, recipe, checkpoint tag, weights, data,
    model geometry."""
    import_plugins(args.plugins)
    return prepare_eval(_open(args), args.split)


def run(args: argparse.Namespace) -> int:
    setup = setup_eval(args)
    recipe = setup.recipe
    _, world, _ = dist.init()
    seed_everything(recipe.seed)

    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import

    device = torch.device(get_accelerator().current_device_name())
    precision = (
        args.precision
        if args.precision != "auto"
        else (recipe.precision if recipe.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32"))
    )
    dtype = torch_dtype(precision)
    model = _eval_model(args, setup, dtype)
    model.eval()
    if dist.is_main():
        print(backends_line(model, recipe, device, dtype), flush=True)
        print(f"avion-ds eval: evaluating {setup.opened.describe()} on the {args.split} split", flush=True)
        if args.offload != "none":
            print(offload_line(args), flush=True)
    if args.offload == "none":
        model = model.to(device=device, dtype=dtype)

    views = recipe.eval.temporal_views * recipe.eval.spatial_views
    loader = build_loader(
        setup.dataset,
        recipe.eval.batch_size or recipe.batch.micro_batch,
        recipe.data.workers,
        shuffle=False,
        seed=recipe.seed,
        drop_last=False,
        distributed=world > 1,
    )
    augment = DeviceAugment(recipe.data, setup.task.label_classes(recipe), train=False)
    outcome = setup.task.evaluate(EvalContext(model, loader, augment, device, recipe, views, dtype))
    if dist.is_main():
        _write_results(args, setup, views, outcome)
    del model
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds eval`."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds eval", lambda: run(args), {ConfigError: 2, DataError: 2})


if __name__ == "__main__":
    sys.exit(main())

"""`avion-ds eval`: evaluate a run directory or exported weights; writes metrics + per-sample scores.

``evaluate_model`` is shared with the training loop: it runs any callable model (a DeepSpeed
engine, a plain module, or a ZeRO-3 offload inference wrapper) over a (distributed) loader,
aggregates multi-view clips, gathers all ranks' predictions and removes the sampler's padding.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError, Recipe, load_recipe
from avion_ds.engine import dist
from avion_ds.engine.metrics import (
    PredictionStore,
    aggregate_outputs,
    compute_metrics,
    per_sample_records,
)


@torch.no_grad()
def evaluate_model(model: Callable[[torch.Tensor], Any], loader: Any, augment: Callable, views: int,
                   device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[dict[str, float], tuple]:
    """Metrics over ``loader`` (all ranks) and the gathered (index, scores, labels)."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    store = PredictionStore()
    for batch in loader:
        frames = batch["frames"].to(device, non_blocking=True)
        labels = batch["label"]
        labels = {k: v.to(device) for k, v in labels.items()} if isinstance(labels, dict) else labels.to(device)
        x, targets = augment(frames, labels)
        out = model(x.to(dtype))
        scores = aggregate_outputs(out, views) if views > 1 else (
            {k: v.float() for k, v in out.items()} if isinstance(out, dict) else out.float())
        store.add(batch["index"], scores, targets)
    if was_training and hasattr(model, "train"):
        model.train()
    index, scores, labels = store.gather()
    return compute_metrics(scores, labels), (index, scores, labels)


# ---------------------------------------------------------------------------------------------
# standalone evaluation
# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="avion-ds eval", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="YAML recipe (default: RUN_DIR/recipe.yaml)")
    p.add_argument("--checkpoint", required=True,
                   help="run directory (latest complete checkpoint) or a weights file (.safetensors/.pt)")
    p.add_argument("--out", default=None, help="metrics JSON (default: <run dir or file dir>/eval_metrics.json)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--split", default="val", choices=("val", "train"))
    p.add_argument("--no-per-sample", action="store_true", help="omit per-sample scores from the JSON")
    p.add_argument("--offload", default="none", choices=("none", "cpu", "nvme"),
                   help="ZeRO-3 parameter offload for models larger than accelerator memory")
    p.add_argument("--max-live-params", type=float, default=1e9, help="ZeRO-3 stage3_max_live_parameters")
    p.add_argument("--prefetch-bucket", type=float, default=5e7, help="ZeRO-3 stage3_prefetch_bucket_size")
    p.add_argument("--nvme-path", default="/local_nvme", help="directory for --offload nvme")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    p.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return p.parse_args(argv)


def consolidated_state_dict(run_dir: str | Path, tag: str | None = None) -> dict[str, torch.Tensor]:
    """fp32 weights of a run's latest complete (or given) checkpoint, via the export path."""
    from avion_ds.engine.export import consolidate

    return consolidate(run_dir, tag)


def _resolve_recipe(args: argparse.Namespace) -> tuple[Recipe, Path | None]:
    ckpt_path = Path(args.checkpoint)
    if not ckpt_path.exists():
        raise ConfigError(f"--checkpoint not found: {ckpt_path}")
    run_dir = ckpt_path if ckpt_path.is_dir() else None
    config = args.config
    if config is None:
        if run_dir is None or not (run_dir / "recipe.yaml").is_file():
            raise ConfigError("--config is required when --checkpoint is not a run directory with recipe.yaml")
        config = run_dir / "recipe.yaml"
    recipe = load_recipe(config, args.overrides)
    return recipe, run_dir


def run(args: argparse.Namespace) -> int:
    from avion_ds.engine.train import (
        build_model,
        check_data_paths,
        recipe_num_classes,
        seed_everything,
    )

    recipe, run_dir = _resolve_recipe(args)
    check_data_paths(recipe, need_train=args.split == "train")
    if recipe.task == "pretrain":  # reconstruction loss vs predict-zero (avion_ds.engine.pretrain)
        from avion_ds.engine.pretrain import run_eval

        return run_eval(args, recipe)
    if run_dir is not None:
        from avion_ds.engine.checkpoint import latest_complete

        if latest_complete(run_dir) is None:
            raise ConfigError(f"--checkpoint {run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}")
    _, world, _ = dist.init()
    seed_everything(recipe.seed)

    from deepspeed.accelerator import get_accelerator

    from avion_ds.data import DeviceAugment, build_dataset, build_loader

    device = torch.device(get_accelerator().current_device_name())
    precision = args.precision if args.precision != "auto" else (
        recipe.precision if recipe.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)

    if run_dir is not None:
        model = build_model(recipe, pretrained="")
        from avion_ds.models import load_pretrained

        load_pretrained(model, consolidated_state_dict(run_dir), strict=True)
    else:
        model = build_model(recipe, pretrained=str(args.checkpoint))
    model.eval()
    if args.offload != "none":
        from avion_ds.memory.offload import wrap_for_inference

        model = wrap_for_inference(model, offload=args.offload, max_live_parameters=int(args.max_live_params),
                                   prefetch_bucket_size=int(args.prefetch_bucket), nvme_path=args.nvme_path,
                                   dtype=dtype)
    else:
        model = model.to(device=device, dtype=dtype)

    views = recipe.eval.temporal_views * recipe.eval.spatial_views
    dataset = build_dataset(recipe.data, args.split, temporal_views=recipe.eval.temporal_views,
                            spatial_views=recipe.eval.spatial_views, seed=recipe.seed)
    loader = build_loader(dataset, recipe.eval.batch_size or recipe.batch.micro_batch, recipe.data.workers,
                          shuffle=False, seed=recipe.seed, drop_last=False, distributed=world > 1)
    augment = DeviceAugment(recipe.data, recipe_num_classes(recipe), train=False)
    metrics, (index, scores, labels) = evaluate_model(model, loader, augment, views, device, dtype)
    if dist.is_main():
        out = Path(args.out) if args.out else (run_dir or Path(args.checkpoint).parent) / "eval_metrics.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        payload: dict[str, Any] = {"checkpoint": str(args.checkpoint), "split": args.split,
                                   "num_samples": int(index.numel()), "views": views, "metrics": metrics}
        if not args.no_per_sample:
            payload["per_sample"] = per_sample_records(index, scores, labels)
        out.write_text(json.dumps(payload) + "\n")
        print(" ".join(f"{k}={v:.2f}" for k, v in metrics.items()), flush=True)
        print(f"wrote {out} ({index.numel()} samples)", flush=True)
    del model
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds eval`."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds eval", lambda: run(args), {ConfigError: 2})

if __name__ == "__main__":
    sys.exit(main())

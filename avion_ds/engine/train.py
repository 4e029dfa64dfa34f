"""`avion-ds train` / `launch/train.py`: fine-tune a video ViT with DeepSpeed from a YAML recipe.

One readable loop. Order of work: parse + validate everything that can fail cheaply (recipe keys,
data paths, DeepSpeed JSON, batch arithmetic, run-dir identity) BEFORE the process group, data
workers or model exist; then build data, model, engine; resume; train epochs (checkpoint every N
steps and at epoch end, evaluate every k epochs); exit through ``dist.shutdown``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avion_ds.config import ConfigError, Recipe, load_recipe, save_recipe
from avion_ds.engine import checkpoint as ckpt
from avion_ds.engine import dist
from avion_ds.engine.ds_config import (
    build_ds_config,
    load_user_config,
    precision_of,
    resolve_batch,
    zero_stage,
)
from avion_ds.engine.evaluate import evaluate_model
from avion_ds.engine.logging import RunLogger, StepTimer, peak_memory_gib
from avion_ds.engine.losses import total_loss
from avion_ds.engine.pretrain import (
    attach_masks,
    build_pretrain_model,
    evaluate_pretrain,
    is_pretrain,
    reconstruction_loss,
)


class NonFiniteLoss(RuntimeError):
    """Raised under ``nonfinite: stop``; exits non-zero without saving."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="avion-ds train", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="YAML recipe (launch/recipes/*.yaml)")
    p.add_argument("--deepspeed_config", "--deepspeed-config", default="ds_configs/zero2.json",
                   help="DeepSpeed JSON (ds_configs/*.json); 'auto' values are filled from the recipe")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted recipe override, repeatable (e.g. --set optim.lr=1e-3)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help="injected by the deepspeed launcher")
    p.add_argument("--exit-after-steps", type=int, default=None,
                   help="stop cleanly after this many optimizer steps in total (preemption drills, tests)")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# checks before any work
# ---------------------------------------------------------------------------------------------
def check_data_paths(recipe: Recipe, need_train: bool = True) -> None:
    """Every data path the recipe names must exist; the error names the key and the path."""
    d = recipe.data
    keys = [("data.root", d.root, "dir"), ("data.val_csv", d.val_csv, "file")]
    if need_train:
        keys.insert(1, ("data.train_csv", d.train_csv, "file"))
    for key, value, kind in keys:
        if not value and d.dataset == "videos" and kind == "file":
            continue  # unlabelled clips: without a list, every video under data.root
        if not value:
            raise ConfigError(f"{key} is empty; set it in the recipe or with --set {key}=PATH")
        path = Path(value)
        ok = path.is_dir() if kind == "dir" else path.is_file()
        if not ok:
            raise ConfigError(f"{key}: {kind} not found: {path}")


def preflight(args: argparse.Namespace) -> tuple[Recipe, dict[str, Any]]:
    """Load and validate recipe, DeepSpeed JSON, batch arithmetic and run dir; no side effects."""
    recipe = load_recipe(args.config, args.overrides)
    check_data_paths(recipe)
    user_ds = load_user_config(args.deepspeed_config)
    world = dist.env_world_size()
    resolve_batch(recipe, world)
    build_ds_config(user_ds, recipe, world, steps_per_epoch=1)  # every conflict surfaces now
    ckpt.check_run_identity(recipe.output_dir, recipe)
    return recipe, user_ds


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(recipe: Recipe, pretrained: str | None = None) -> torch.nn.Module:
    """The recipe's model through the model package (frames/size follow the data section)."""
    from avion_ds.models import create_model

    if is_pretrain(recipe):
        return build_pretrain_model(recipe, pretrained)
    m = recipe.model
    kw: dict[str, Any] = {"num_frames": recipe.data.num_frames, "img_size": recipe.data.size,
                              "drop_path_rate": m.drop_path_rate, "head_drop_rate": m.head_drop_rate,
                              "attn_backend": m.attn_backend, "patch_embed": m.patch_embed, "pool": m.pool,
                              "pos_embed": m.pos_embed}
    if m.tubelet_size is not None:
        kw["tubelet_size"] = m.tubelet_size
    if m.heads is not None:
        kw["heads"] = dict(m.heads)
    else:
        kw["num_classes"] = m.num_classes
    return create_model(m.name, pretrained=pretrained if pretrained is not None else (m.pretrained or None), **kw)


def recipe_num_classes(recipe: Recipe) -> int | dict[str, int]:
    """Class count(s) of the MODEL's heads: what targets (mixup, smoothing) must be shaped for.

    Taken from the recipe, not the dataset: a CSV that lacks the top classes must not shrink them.
    """
    return dict(recipe.model.heads) if recipe.model.heads is not None else recipe.model.num_classes


class _SkipSampler(torch.utils.data.Sampler):
    """Yields ``sampler``'s indices after the first ``skip`` (resume inside an epoch)."""

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i, idx in enumerate(self.sampler):
            if i >= self.skip:
                yield idx

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


def loader_skipping(loader: torch.utils.data.DataLoader, skip_samples: int) -> torch.utils.data.DataLoader:
    """A copy of ``loader`` that starts ``skip_samples`` into its (already epoch-seeded) sampler."""
    kw: dict[str, Any] = {"batch_size": loader.batch_size, "drop_last": loader.drop_last,
                              "num_workers": loader.num_workers, "collate_fn": loader.collate_fn,
                              "pin_memory": loader.pin_memory, "worker_init_fn": loader.worker_init_fn,
                              "generator": loader.generator, "timeout": loader.timeout}
    if loader.num_workers > 0:
        kw.update(prefetch_factor=loader.prefetch_factor, persistent_workers=False,
                  multiprocessing_context=loader.multiprocessing_context)
    return torch.utils.data.DataLoader(loader.dataset, sampler=_SkipSampler(loader.sampler, skip_samples), **kw)


def to_device(labels: Any, device: torch.device) -> Any:
    if isinstance(labels, dict):
        return {k: v.to(device, non_blocking=True) for k, v in labels.items()}
    return labels.to(device, non_blocking=True)


def _float(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _module_grad_norm(engine: Any) -> float | None:
    """Pre-clipping grad norm for ZeRO-0 (DeepSpeed only records it for ZeRO >= 1); grads are all-reduced."""
    grads = [p.grad.float() for p in engine.module.parameters() if p.grad is not None]  # no-op for fp32
    return float(torch.nn.utils.get_total_norm(grads)) if grads else None  # fused (foreach) norms


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    recipe, user_ds = preflight(args)
    rank, world, _ = dist.init()
    seed_everything(recipe.seed)
    run_dir = Path(recipe.output_dir)

    from deepspeed.accelerator import get_accelerator

    from avion_ds.data import DeviceAugment, build_dataset, build_loader
    from avion_ds.engine.parallelize import parallelize

    plan = resolve_batch(recipe, world)
    train_set = build_dataset(recipe.data, "train", seed=recipe.seed)
    val_set = build_dataset(recipe.data, "val", temporal_views=recipe.eval.temporal_views,
                            spatial_views=recipe.eval.spatial_views, seed=recipe.seed)
    pretraining = is_pretrain(recipe)
    if pretraining:
        attach_masks(recipe, train_set, val_set)
    train_loader = build_loader(train_set, plan.micro_batch, recipe.data.workers, shuffle=True, seed=recipe.seed,
                                drop_last=True, distributed=True)
    eval_bs = recipe.eval.batch_size or plan.micro_batch
    val_loader = build_loader(val_set, eval_bs, recipe.data.workers, shuffle=False, seed=recipe.seed,
                              drop_last=False, distributed=True)
    micro_per_epoch = len(train_loader)
    steps_per_epoch = micro_per_epoch // plan.grad_accum
    if recipe.schedule.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, recipe.schedule.steps_per_epoch)
    if steps_per_epoch <= 0:
        raise ConfigError(f"train split has {len(train_set)} clips: fewer than one optimizer step of "
                          f"{plan.global_batch} (micro {plan.micro_batch} x accum {plan.grad_accum} x world {world})")

    ds_config = build_ds_config(user_ds, recipe, world, steps_per_epoch)
    if dist.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, run_dir / "recipe.yaml")
        (run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    ckpt.write_run_identity(run_dir, recipe)

    model = build_model(recipe)
    seed_everything(recipe.seed + rank)  # per-rank streams for dropout / augmentation
    engine = parallelize(model, recipe, ds_config, steps_per_epoch)
    del model
    device = torch.device(get_accelerator().current_device_name())
    precision = precision_of(ds_config)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    num_classes = recipe_num_classes(recipe)
    train_aug = DeviceAugment(recipe.data, num_classes, train=True)
    eval_aug = DeviceAugment(recipe.data, num_classes, train=False)
    log = RunLogger(run_dir, dist.is_main(), recipe.logging.tensorboard, recipe.logging.progress,
                    recipe.logging.log_every)
    log.info(f"avion-ds train: {recipe.task} {recipe.model.name} | world {world} | ZeRO-{zero_stage(ds_config)} | {precision} | "
             f"global batch {plan.global_batch} = micro {plan.micro_batch} x accum {plan.grad_accum} x world {world}"
             f" | {steps_per_epoch} steps/epoch x {recipe.schedule.epochs} epochs | activation checkpointing "
             f"{recipe.model.checkpoint_impl if recipe.model.activation_checkpointing else 'off'} | run dir {run_dir}")

    start_epoch, start_step, global_step, skipped, bad_samples = 0, 0, 0, 0, 0
    pending_rng = None
    if recipe.checkpoint.resume:
        client = ckpt.load_latest(engine, run_dir)
        if client is not None:
            start_epoch, start_step = int(client["epoch"]), int(client["step_in_epoch"])
            global_step, skipped = int(client["global_step"]), int(client.get("skipped", 0))
            bad_samples = int(client.get("bad_samples", 0))
            pending_rng = client["rng"]
            if engine.lr_scheduler is not None and "scheduler" in client:
                engine.lr_scheduler.load_state_dict(client["scheduler"])
            log.info(f"resumed from {client['tag']}: epoch {start_epoch}, step {start_step} in epoch, "
                     f"global step {global_step}")

    sched = engine.lr_scheduler

    def client_state(epoch: int, step_in_epoch: int) -> dict[str, Any]:
        st = {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step, "skipped": skipped,
              "bad_samples": bad_samples,
              "model": ckpt.model_identity(recipe)}
        if sched is not None and hasattr(sched, "state_dict"):
            st["scheduler"] = sched.state_dict()
        return st

    timer = StepTimer(sync=device.type == "cuda")
    smoothing = recipe.data.label_smoothing  # used for int targets only; mixed soft targets carry their own
    exit_after = args.exit_after_steps
    for epoch in range(start_epoch, recipe.schedule.epochs):
        for ds in (train_set, val_set):
            if hasattr(ds, "set_epoch"):
                ds.set_epoch(epoch)
        if hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        first = start_step if epoch == start_epoch else 0
        loader = train_loader if first == 0 else loader_skipping(
            train_loader, first * plan.grad_accum * plan.micro_batch)
        it = iter(loader)
        if pending_rng is not None:  # after the iterator drew its worker seeds, as the first run did
            ckpt.set_rng_state(pending_rng)
            pending_rng = None
        engine.train()
        log.start_epoch(epoch, steps_per_epoch, initial=first)
        step_in_epoch = first
        window_loss, window_n, window_heads = 0.0, 0, {}
        t_window = time.perf_counter()
        timer.pop()
        timer._t = time.perf_counter()
        while step_in_epoch < steps_per_epoch:
            try:
                batch = next(it)
            except StopIteration:
                break
            frames = batch["frames"].to(device, non_blocking=True)
            labels = to_device(batch["label"], device)
            x, targets = train_aug(frames, labels)
            timer.mark_data()
            out = engine(x.to(dtype), **targets) if pretraining else engine(x.to(dtype))
            loss, parts = reconstruction_loss(out) if pretraining else total_loss(out, targets, smoothing)
            # one collective for the loss and the count of bad input samples the loader skipped
            bad_here = float(batch["skipped"].sum()) if "skipped" in batch else 0.0
            reduced = dist.all_reduce_sum(torch.stack([loss.detach().float(), loss.new_tensor(bad_here).float()]))
            loss_sum, bad_samples = reduced[:1], bad_samples + int(reduced[1])
            if not torch.isfinite(loss_sum).all():
                if recipe.nonfinite == "stop":
                    raise NonFiniteLoss(f"non-finite loss at global step {global_step + 1} (epoch {epoch}, "
                                        f"step {step_in_epoch + 1} of the epoch); stopping, nothing saved")
                skipped += 1
                log.info(f"non-finite loss at global step {global_step + 1}: micro-batch skipped ({skipped} so far)")
                del out, loss
                timer.mark_compute()
                continue
            boundary = engine.is_gradient_accumulation_boundary()
            step_lr = max(g["lr"] for g in engine.optimizer.param_groups)  # the lr this step uses
            engine.backward(loss)
            stage0_norm = _module_grad_norm(engine) if boundary and zero_stage(ds_config) == 0 else None
            engine.step()
            timer.mark_compute()
            window_loss += float(loss_sum) / world
            window_n += 1
            for h, v in parts.items():
                window_heads[h] = window_heads.get(h, 0.0) + v
            if not boundary:
                continue
            global_step += 1
            step_in_epoch += 1
            wait, compute = timer.pop()
            now = time.perf_counter()
            values: dict[str, Any] = {
                "loss": window_loss / max(1, window_n),
                "lr": step_lr,
                "grad_norm": _float(engine.get_global_grad_norm()) if stage0_norm is None else stage0_norm,
                "loss_scale": _float(engine._get_optimizer_loss_scale()) if precision == "fp16" else None,
                "clips_per_s": plan.global_batch / max(now - t_window, 1e-9),
                "data_wait_s": wait, "compute_s": compute,
                "data_wait_frac": wait / max(wait + compute, 1e-9),
                "peak_gib": peak_memory_gib(),
                "skipped_nonfinite": skipped,
                "bad_samples": bad_samples,  # unreadable videos / bad rows skipped by the loader so far
            }
            values.update({f"loss_{h}": v / max(1, window_n) for h, v in window_heads.items()})
            log.step(epoch, global_step, values)
            window_loss, window_n, window_heads = 0.0, 0, {}
            t_window = now
            every = recipe.checkpoint.every_steps
            stop_now = exit_after is not None and global_step >= exit_after
            if (every and global_step % every == 0 and step_in_epoch < steps_per_epoch) or (
                    stop_now and step_in_epoch < steps_per_epoch):
                ckpt.save(engine, run_dir, global_step, client_state(epoch, step_in_epoch),
                          recipe.checkpoint.keep_last)
            if stop_now:
                break
        log.end_epoch()
        del it, loader
        if exit_after is not None and global_step >= exit_after and step_in_epoch < steps_per_epoch:
            log.info(f"stopping after {global_step} steps (--exit-after-steps)")
            break
        last = epoch + 1 == recipe.schedule.epochs
        if (epoch + 1) % max(1, recipe.eval.every_epochs) == 0 or last:
            metrics = evaluate_pretrain(engine, val_loader, eval_aug, device, dtype) if pretraining else evaluate_model(
                engine, val_loader, eval_aug, recipe.eval.temporal_views * recipe.eval.spatial_views, device, dtype)[0]
            log.eval(epoch, global_step, metrics)
            if dist.is_main():
                (run_dir / "metrics.json").write_text(json.dumps({"epoch": epoch, "step": global_step,
                                                                   **metrics}, indent=2) + "\n")
        ckpt.save(engine, run_dir, global_step, client_state(epoch + 1, 0), recipe.checkpoint.keep_last)
        if exit_after is not None and global_step >= exit_after:
            log.info(f"stopping after {global_step} steps (--exit-after-steps)")
            break
    log.info(f"done: {global_step} steps, {skipped} non-finite micro-batches skipped, {bad_samples} bad input "
             f"samples skipped (named in the log above), run dir {run_dir}")
    log.close()
    del engine
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds train` and `launch/train.py`; exits through ``dist.shutdown``."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds train", lambda: run(args), {ConfigError: 2, NonFiniteLoss: 3})

if __name__ == "__main__":
    sys.exit(main())

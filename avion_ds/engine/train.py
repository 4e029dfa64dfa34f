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
import yaml

from avion_ds.config import ConfigError, Recipe, load_recipe, save_recipe
from avion_ds.data.errors import DataError
from avion_ds.data.protocols import eval_report
from avion_ds.engine import checkpoint as ckpt
from avion_ds.engine import dist, elastic
from avion_ds.engine.accum import poison, step_window
from avion_ds.engine.bad_input import BadInputLog, batch_messages
from avion_ds.engine.ds_config import (
    BatchPlan,
    accelerator_name,
    build_ds_config,
    load_user_config,
    precision_of,
    resolve_batch,
    validate_with_deepspeed,
    zero_stage,
)
from avion_ds.engine.eval_loop import evaluate_model
from avion_ds.engine.logging import RunLogger, StepTimer, peak_memory_gib
from avion_ds.engine.losses import total_loss
from avion_ds.engine.metrics import failed_line
from avion_ds.engine.oom import OutOfMemory, explain_from_args
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
    p = argparse.ArgumentParser(prog="avion-ds train", description=__doc__.splitlines()[0],
                                epilog="exit codes: 0 done, 1 failure (traceback), 2 bad input (one line), "
                                       "3 non-finite loss/weights stop")
    p.add_argument("--config", required=True, help="YAML recipe (launch/recipes/*.yaml)")
    p.add_argument("--deepspeed_config", "--deepspeed-config", default="ds_configs/zero2.json",
                   help="DeepSpeed JSON (ds_configs/*.json); 'auto' values are filled from the recipe")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted recipe override, repeatable (e.g. --set optim.lr=1e-3)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow full unpickling of a weights file that pickles more than tensors (it can run code); "
                        "same as --set model.trust_checkpoint=true")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help="injected by the deepspeed launcher")
    p.add_argument("--exit-after-steps", type=int, default=None,
                   help="stop cleanly after this many optimizer steps in total (preemption drills, tests)")
    p.add_argument("--dry-run", action="store_true",
                   help="run every start-up check, print the resolved recipe and DeepSpeed config, exit 0")
    p.add_argument("--resume-from", default=None, metavar="TAG|none",
                   help="resume from this checkpoint tag of output_dir (e.g. step_00000120), or 'none' to start "
                        "fresh; default: the newest complete checkpoint (checkpoint.resume)")
    p.add_argument("--finetune-from", default=None, metavar="FILE",
                   help="initialise the model from these weights (any format model.pretrained reads: VideoMAE, "
                        "Hugging Face, timm, an avion-ds export); same as --set model.pretrained=FILE")
    args = p.parse_args(argv)
    if args.trust_checkpoint:
        args.overrides.append("model.trust_checkpoint=true")
    return args


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
    if d.class_list and not Path(d.class_list).is_file():
        raise ConfigError(f"data.class_list: file not found: {d.class_list}")
    if d.quarantine not in ("", "auto", "none") and not Path(d.quarantine).is_file():
        raise ConfigError(f"data.quarantine: file not found: {d.quarantine} (auto | none | a quarantine.tsv)")
    if d.dataset == "ssv2" and not d.class_list and not (Path(d.train_csv or d.val_csv).parent / "labels.json").is_file():
        raise ConfigError(f"data.class_list is empty and there is no labels.json next to {d.train_csv or d.val_csv}: "
                          f"set data.class_list to SSv2's labels.json")


def optimizer_steps_per_epoch(micro_batches: int, clips: int, recipe: Recipe, plan: BatchPlan) -> int:
    """Optimizer steps per epoch from the micro-batches one rank sees (capped by schedule.steps_per_epoch)."""
    steps = micro_batches // plan.grad_accum
    if recipe.schedule.steps_per_epoch:
        steps = min(steps, recipe.schedule.steps_per_epoch)
    if steps <= 0:
        raise ConfigError(f"data.train_csv has {clips} clips: fewer than one optimizer step of {plan.global_batch} "
                          f"(micro {plan.micro_batch} x accum {plan.grad_accum} x world {plan.world_size})")
    return steps


def _recipe_overrides(args: argparse.Namespace) -> list[str]:
    """--set overrides plus what --finetune-from / --resume-from none imply."""
    extra = []
    if args.finetune_from is not None:
        if not Path(args.finetune_from).exists():
            raise ConfigError(f"--finetune-from {args.finetune_from}: file not found")
        extra.append(f"model.pretrained={json.dumps(str(args.finetune_from))}")
    if args.resume_from is not None:  # a tag resumes even where the recipe says checkpoint.resume: false
        extra.append(f"checkpoint.resume={'false' if args.resume_from.lower() == 'none' else 'true'}")
    return [*args.overrides, *extra]


def preflight(args: argparse.Namespace) -> tuple[Recipe, dict[str, Any]]:
    """Validate everything that can fail cheaply; no process group, worker, dataset or real model.

    Recipe keys and ranges, data paths, chunk manifest, annotation headers and labels vs heads, model
    name + geometry (built on the meta device), attention backend and precision vs this machine,
    DeepSpeed JSON (unknown keys, section types, DeepSpeed's own config model), batch arithmetic,
    output_dir, run-dir identity, --resume-from tag.
    """
    from avion_ds.engine import preflight as pf

    recipe = load_recipe(args.config, _recipe_overrides(args))
    pf.check_output_dir(recipe)
    check_data_paths(recipe)
    pf.check_heads(recipe)
    summary = pf.check_model(recipe)
    rows = pf.check_data_layout(recipe)
    user_ds = load_user_config(args.deepspeed_config)
    world = dist.env_world_size()
    plan = resolve_batch(recipe, world)
    steps = optimizer_steps_per_epoch(rows["train"] // world // plan.micro_batch, rows["train"], recipe, plan)
    ds_config = build_ds_config(user_ds, recipe, world, steps_per_epoch=steps)  # every conflict surfaces now
    validate_with_deepspeed(ds_config)
    pf.check_runtime(recipe, precision_of(ds_config), accelerator_name())
    ckpt.check_run_identity(recipe.output_dir, recipe)
    if args.resume_from is not None and args.resume_from.lower() != "none":
        ckpt.check_tag(recipe.output_dir, args.resume_from)
    if args.dry_run:
        print(f"# avion-ds train --dry-run: all checks passed | {summary.name} {summary.params / 1e6:.2f}M params, "
              f"{summary.gflops:.1f} GFLOPs/clip, token grid {summary.grid} | world {world} | {steps} steps/epoch")
        print("# resolved recipe")
        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), end="")
        print("# DeepSpeed config")
        print(json.dumps(ds_config, indent=2))
    return recipe, user_ds


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(recipe: Recipe, pretrained: str | None = None, run_dir: Path | None = None,
                ds_config: dict[str, Any] | None = None) -> torch.nn.Module:
    """The recipe's model through the model package (frames/size follow the data section).

    With a ZeRO-3 ``ds_config`` it is built partitioned (``deepspeed.zero.Init``) and the weights
    are loaded module by module: no rank ever holds the whole model. Weights (``pretrained``, else
    ``model.pretrained``) load through ``load_and_report``: a summary line on rank 0,
    ``run_dir/pretrained_report.json``, and the ``model.pretrained_strict`` check.
    """
    from avion_ds.engine.preflight import model_kwargs
    from avion_ds.engine.pretrained_report import load_and_report
    from avion_ds.models import create_model
    from avion_ds.models.sharded_load import build_partitioned

    m = recipe.model
    source = pretrained if pretrained is not None else m.pretrained
    if is_pretrain(recipe):  # the pretraining model reads its own formats (official / HF VideoMAE pretraining)
        if source and zero_stage(ds_config or {}) == 3:
            raise ConfigError(f"model.pretrained={source}: continuing a pretraining run from weights under ZeRO-3 "
                              "is not supported yet; resume from the run's checkpoint instead")
        if source:
            return build_pretrain_model(recipe, str(source))
        return build_partitioned(lambda: build_pretrain_model(recipe, ""), ds_config)
    kw = model_kwargs(recipe)
    model = build_partitioned(lambda: create_model(m.name, **kw), ds_config)
    if source:
        load_and_report(model, str(source), strict=m.pretrained_strict, trust=m.trust_checkpoint, run_dir=run_dir,
                        is_main=dist.is_main())
    return model


def backends_line(model: torch.nn.Module, recipe: Recipe, device: torch.device, dtype: torch.dtype) -> str:
    """Which attention kernel and video decoder actually run (never a silent fallback)."""
    from avion_ds.models.attention import Attention, describe_backend

    attn = next((m for m in model.modules() if isinstance(m, Attention)), None)
    a = describe_backend(attn.backend, device, dtype, attn.head_dim) if attn is not None else "none"
    d = recipe.data
    where = (f"helper process, timeout {d.decode_timeout_s:g} s" if d.decode_timeout_s > 0 else "in-process")
    return f"attention backend {a} | decoder {d.decoder} ({where}, {d.decoder_threads} thread(s) per worker)"


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


def zero0_grad_norm(engine: Any, loss_scale: float | None = None) -> float | None:
    """Pre-clipping grad norm for ZeRO-0 (DeepSpeed only records it for ZeRO >= 1); grads are all-reduced.

    Under fp16 the gradients still carry the loss scale: pass it to get the true norm.
    """
    grads = [p.grad.float() for p in engine.module.parameters() if p.grad is not None]  # no-op for fp32
    if not grads:
        return None
    norm = float(torch.nn.utils.get_total_norm(grads))  # fused (foreach) norms
    return norm / loss_scale if loss_scale else norm


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    recipe, user_ds = preflight(args)
    if args.dry_run:
        return 0
    rank, world, _ = dist.init()
    seed_everything(recipe.seed)
    run_dir = Path(recipe.output_dir)

    from deepspeed.accelerator import get_accelerator

    from avion_ds.data import DeviceAugment, build_dataset, build_loader
    from avion_ds.data.decoders import pick_decoder
    from avion_ds.engine.parallelize import parallelize

    plan = resolve_batch(recipe, world)
    # data.decoder=auto: probed once on rank 0, recorded in the run dir so a resume keeps the choice
    picked = pick_decoder(recipe.data, run_dir, recipe.checkpoint.resume) if dist.is_main() else None
    recipe.data.decoder, decoder_note = dist.broadcast_object(picked)
    train_set = build_dataset(recipe.data, "train", seed=recipe.seed)
    val_set = build_dataset(recipe.data, "val", temporal_views=recipe.eval.temporal_views,
                            spatial_views=recipe.eval.spatial_views, seed=recipe.seed)
    for ds in (train_set, val_set):
        ds.defer_errors = True  # bad samples reported through the loop (named once, fatal on every rank)
    pretraining = is_pretrain(recipe)
    if pretraining:
        attach_masks(recipe, train_set, val_set)
    train_loader = build_loader(train_set, plan.micro_batch, recipe.data.workers, shuffle=True, seed=recipe.seed,
                                drop_last=True, distributed=True)
    eval_bs = recipe.eval.batch_size or plan.micro_batch
    val_loader = build_loader(val_set, eval_bs, recipe.data.workers, shuffle=False, seed=recipe.seed,
                              drop_last=False, distributed=True)
    steps_per_epoch = optimizer_steps_per_epoch(len(train_loader), len(train_set), recipe, plan)

    ds_config = build_ds_config(user_ds, recipe, world, steps_per_epoch)
    if dist.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, run_dir / "recipe.yaml")
        (run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    ckpt.write_run_identity(run_dir, recipe)

    resize = elastic.prepare_resume(run_dir, ds_config) if recipe.checkpoint.resume else None
    if resize and dist.is_main():
        print(resize, flush=True)
    model = build_model(recipe, run_dir=run_dir, ds_config=ds_config)
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
    log.info(backends_line(engine.module, recipe, device, dtype))
    for ds in (train_set, val_set):  # rows dropped up front: missing videos, quarantine.tsv (avion-ds check)
        listed = ds.write_skipped(run_dir / f"skipped_rows_{ds.split}.txt") if dist.is_main() else None
        log.info(f"data {ds.startup_line()}" + (f" (listed in {listed})" if listed else ""))

    log.info(decoder_note)
    start_epoch, start_step, global_step, skipped, bad_samples, consecutive = 0, 0, 0, 0, 0, 0
    applied_steps, overflow_steps = 0, 0  # optimizer updates applied / skipped by fp16 loss-scale overflow
    pending_rng = None
    bad_log = BadInputLog(log.info)
    resume_tag = args.resume_from if args.resume_from and args.resume_from.lower() != "none" else None
    if recipe.checkpoint.resume:
        client = ckpt.load_latest(engine, run_dir, resume_tag)
        if client is not None:
            start_epoch, start_step = int(client["epoch"]), int(client["step_in_epoch"])
            global_step, skipped = int(client["global_step"]), int(client.get("skipped", 0))
            bad_samples = int(client.get("bad_samples", 0))
            applied_steps = int(client.get("applied_steps", global_step))
            overflow_steps = int(client.get("overflow_steps", 0))
            pending_rng = client["rng"]
            if engine.lr_scheduler is not None and "scheduler" in client:
                engine.lr_scheduler.load_state_dict(client["scheduler"])
            log.info(f"resumed from {client['tag']}: epoch {start_epoch}, step {start_step} in epoch, "
                     f"global step {global_step}")
    log.truncate_history(global_step)  # rows past the resumed step would be written again

    sched = engine.lr_scheduler

    def client_state(epoch: int, step_in_epoch: int) -> dict[str, Any]:
        st = {"epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step, "skipped": skipped,
              "bad_samples": bad_samples, "applied_steps": applied_steps, "overflow_steps": overflow_steps,
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
        window_loss, window_n, window_heads, window_bad = 0.0, 0, {}, False
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
            # one collective for the loss, the count of bad input samples the loader skipped and fatal input errors
            bad_msgs, fatal_msgs = batch_messages(batch)
            bad_here = float(batch["skipped"].sum()) if "skipped" in batch else 0.0
            reduced = dist.all_reduce_sum(torch.stack([loss.detach().float(), loss.new_tensor(bad_here).float(),
                                                       loss.new_tensor(float(len(fatal_msgs))).float()]))
            loss_sum, bad_samples = reduced[:1], bad_samples + int(reduced[1])
            bad_now = not torch.isfinite(loss_sum).all()  # the same verdict on every rank (all-reduced)
            if int(reduced[1]) or int(reduced[2]):  # rare: name new bad files once, stop every rank on a fatal one
                bad_log.exchange(bad_msgs, fatal_msgs)
            if bad_now:
                if recipe.nonfinite == "stop":
                    raise NonFiniteLoss(f"non-finite loss at global step {global_step + 1} (epoch {epoch}, "
                                        f"step {step_in_epoch + 1} of the epoch); stopping, nothing saved")
                skipped += 1
                window_bad = True
                consecutive += 1
                log.info(f"non-finite loss at global step {global_step + 1}: its whole accumulation window "
                         f"({plan.grad_accum} micro-batch(es)) is skipped on every rank ({skipped} so far)")
                if consecutive >= recipe.nonfinite_max_consecutive:
                    raise NonFiniteLoss(f"{consecutive} non-finite micro-batches in a row (nonfinite_max_consecutive="
                                        f"{recipe.nonfinite_max_consecutive}) at global step {global_step + 1}; "
                                        "stopping, nothing saved")
            else:
                consecutive = 0
            boundary = engine.is_gradient_accumulation_boundary()
            step_lr = max(g["lr"] for g in engine.optimizer.param_groups)  # the lr this step uses
            scale = _float(engine._get_optimizer_loss_scale()) if precision == "fp16" else None  # before step()
            engine.backward(poison(loss) if bad_now else loss)
            stage0_norm = (zero0_grad_norm(engine, scale) if boundary and not window_bad
                           and zero_stage(ds_config) == 0 else None)
            applied = step_window(engine, window_bad)
            timer.mark_compute()
            if not bad_now:
                window_loss += float(loss_sum) / world
                window_n += 1
                for h, v in parts.items():
                    window_heads[h] = window_heads.get(h, 0.0) + v
            if not boundary:
                continue
            global_step += 1  # the data position: one window consumed, applied or not
            step_in_epoch += 1
            applied_steps += applied
            overflow_steps += not applied and not window_bad
            wait, compute = timer.pop()
            now = time.perf_counter()
            values: dict[str, Any] = {
                "loss": window_loss / window_n if window_n else None,
                "lr": step_lr,
                "grad_norm": None if window_bad else (
                    _float(engine.get_global_grad_norm()) if stage0_norm is None else stage0_norm),
                "loss_scale": _float(engine._get_optimizer_loss_scale()) if precision == "fp16" else None,
                "clips_per_s": plan.global_batch / max(now - t_window, 1e-9),
                "data_wait_s": wait, "compute_s": compute,
                "data_wait_frac": wait / max(wait + compute, 1e-9),
                "peak_gib": peak_memory_gib(),
                "skipped_nonfinite": skipped,
                "applied_steps": applied_steps,  # optimizer updates applied so far (<= global step)
                "overflow_steps": overflow_steps,  # fp16 loss-scale overflows (update skipped by DeepSpeed)
                "bad_samples": bad_samples,  # unreadable videos / bad rows skipped by the loader so far
            }
            values.update({f"loss_{h}": v / max(1, window_n) for h, v in window_heads.items()})
            log.step(epoch, global_step, values)
            window_loss, window_n, window_heads, window_bad = 0.0, 0, {}, False
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
            views = recipe.eval.temporal_views * recipe.eval.spatial_views
            failed: list[dict[str, Any]] = []
            if pretraining:
                metrics, evaluated = evaluate_pretrain(engine, val_loader, eval_aug, device, dtype), None
            else:
                metrics, (evaluated, _, _), failed = evaluate_model(engine, val_loader, eval_aug, views, device,
                                                                    dtype, bad_log=bad_log)
            if failed:
                log.info(failed_line(failed))
            log.eval(epoch, global_step, metrics)
            if dist.is_main():
                report = None if evaluated is None else eval_report(recipe.eval.protocol, views, val_set, evaluated)
                (run_dir / "metrics.json").write_text(json.dumps({"epoch": epoch, "step": global_step, **metrics,
                                                                   "failed_samples": failed, "eval": report},
                                                                  indent=2) + "\n")
        ckpt.save(engine, run_dir, global_step, client_state(epoch + 1, 0), recipe.checkpoint.keep_last)
        if exit_after is not None and global_step >= exit_after:
            log.info(f"stopping after {global_step} steps (--exit-after-steps)")
            break
    log.info(f"done: {global_step} steps ({applied_steps} applied, {overflow_steps} fp16 overflows), {skipped} "
             f"non-finite micro-batches skipped, {bad_samples} bad input "
             f"samples skipped (named in the log above), run dir {run_dir}")
    log.close()
    del engine
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds train` and `launch/train.py`; exits through ``dist.shutdown``."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds train", lambda: _run_explaining_oom(args),
                          {ConfigError: 2, DataError: 2, NonFiniteLoss: 3, ckpt.NonFiniteWeights: 3, OutOfMemory: 1})


def _run_explaining_oom(args: argparse.Namespace) -> int:
    """``run``, with an out-of-memory error turned (once) into the one-line ``OutOfMemory``."""
    try:
        return run(args)
    except torch.OutOfMemoryError as e:
        raise OutOfMemory(explain_from_args(args, e)) from None

if __name__ == "__main__":
    sys.exit(main())

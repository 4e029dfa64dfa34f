"""`avion-ds train` / `launch/train.py`: fine-tune a video ViT with DeepSpeed from a YAML recipe.

Only wiring; the loop is ``avion_ds.engine.trainer.Trainer``. Order of work: parse + validate
everything that can fail cheaply (recipe keys, data paths, DeepSpeed JSON, batch arithmetic, run-dir
identity) BEFORE the process group, data workers or model exist; then build data, model, engine;
resume; ``Trainer.fit`` (checkpoint every N steps and at epoch end, evaluate every k epochs); exit
through ``dist.shutdown``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from avion_ds.config import ConfigError, Recipe, load_recipe, save_recipe
from avion_ds.data.errors import DataError
from avion_ds.engine import checkpoint as ckpt
from avion_ds.engine import dist, elastic
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
from avion_ds.engine.logging import RunLogger
from avion_ds.engine.losses import total_loss
from avion_ds.engine.oom import OutOfMemory, explain_from_args
from avion_ds.engine.pretrain import attach_masks, build_pretrain_model, is_pretrain
from avion_ds.engine.trainer import (  # noqa: F401 - NonFiniteLoss, zero0_grad_norm re-exported
    NonFiniteLoss,
    TrainData,
    Trainer,
    zero0_grad_norm,
)


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

    if args.exit_after_steps is not None and args.exit_after_steps < 1:
        raise ConfigError(f"--exit-after-steps {args.exit_after_steps}: must be >= 1 (optimizer steps)")
    recipe = load_recipe(args.config, _recipe_overrides(args))
    pf.check_output_dir(recipe)
    if recipe.model.pretrained:
        pf.check_weights_source(recipe.model.pretrained, recipe.model.trust_checkpoint)
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


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def build_data(recipe: Recipe, plan: BatchPlan, run_dir: Path) -> tuple[TrainData, str]:
    """Datasets and loaders (bad samples deferred to the loop) and the decoder note; all ranks."""
    from avion_ds.data import DeviceAugment, build_dataset, build_loader
    from avion_ds.data.decoders import pick_decoder

    # data.decoder=auto: probed once on rank 0, recorded in the run dir so a resume keeps the choice
    picked = pick_decoder(recipe.data, run_dir, recipe.checkpoint.resume) if dist.is_main() else None
    recipe.data.decoder, decoder_note = dist.broadcast_object(picked)
    train_set = build_dataset(recipe.data, "train", seed=recipe.seed)
    val_set = build_dataset(recipe.data, "val", temporal_views=recipe.eval.temporal_views,
                            spatial_views=recipe.eval.spatial_views, seed=recipe.seed)
    for ds in (train_set, val_set):
        ds.defer_errors = True  # bad samples reported through the loop (named once, fatal on every rank)
    if is_pretrain(recipe):
        attach_masks(recipe, train_set, val_set)
    train_loader = build_loader(train_set, plan.micro_batch, recipe.data.workers, shuffle=True, seed=recipe.seed,
                                drop_last=True, distributed=True)
    eval_bs = recipe.eval.batch_size or plan.micro_batch
    val_loader = build_loader(val_set, eval_bs, recipe.data.workers, shuffle=False, seed=recipe.seed,
                              drop_last=False, distributed=True)
    steps = optimizer_steps_per_epoch(len(train_loader), len(train_set), recipe, plan)
    eval_aug = DeviceAugment(recipe.data, recipe_num_classes(recipe), train=False)
    return TrainData(train_loader, val_loader, train_set, val_set, eval_aug, steps), decoder_note


def start_lines(recipe: Recipe, ds_config: dict[str, Any], plan: BatchPlan, trainer: Trainer,
                data: TrainData) -> list[str]:
    """What the run is: task, model, world, ZeRO stage, precision, batch arithmetic, backends."""
    world = plan.world_size
    ac = recipe.model.checkpoint_impl if recipe.model.activation_checkpointing else "off"
    return [(f"avion-ds train: {recipe.task} {recipe.model.name} | world {world} | ZeRO-{zero_stage(ds_config)} | "
            f"{trainer.precision} | global batch {plan.global_batch} = micro {plan.micro_batch} x accum "
            f"{plan.grad_accum} x world {world} | {data.steps_per_epoch} steps/epoch x {recipe.schedule.epochs} "
            f"epochs | activation checkpointing {ac} | run dir {recipe.output_dir}"),
            backends_line(trainer.engine.module, recipe, trainer.device, trainer.dtype)]


def run(args: argparse.Namespace) -> int:
    """Wire the run: checks, process group, data, DeepSpeed config, model, engine, ``Trainer.fit``."""
    recipe, user_ds = preflight(args)
    if args.dry_run:
        return 0
    rank, world, _ = dist.init()
    seed_everything(recipe.seed)
    run_dir = Path(recipe.output_dir)
    from avion_ds.data import DeviceAugment
    from avion_ds.engine.parallelize import parallelize

    plan = resolve_batch(recipe, world)
    data, decoder_note = build_data(recipe, plan, run_dir)
    ds_config = build_ds_config(user_ds, recipe, world, data.steps_per_epoch)
    if dist.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, run_dir / "recipe.yaml")
        (run_dir / "ds_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    ckpt.write_run_identity(run_dir, recipe)

    resize = (elastic.prepare_resume(run_dir, ds_config, trust=recipe.model.trust_checkpoint)
              if recipe.checkpoint.resume else None)
    if resize and dist.is_main():
        print(resize, flush=True)
    model = build_model(recipe, run_dir=run_dir, ds_config=ds_config)
    seed_everything(recipe.seed + rank)  # per-rank streams for dropout / augmentation
    engine = parallelize(model, recipe, ds_config, data.steps_per_epoch)
    del model
    log = RunLogger(run_dir, dist.is_main(), recipe.logging.tensorboard, recipe.logging.progress,
                    recipe.logging.log_every)
    augment = DeviceAugment(recipe.data, recipe_num_classes(recipe), train=True)
    # total_loss is read from this module at run time (test harnesses replace it here)
    trainer = Trainer(engine, recipe, log=log, augment=augment, loss_fn=total_loss)
    for line in start_lines(recipe, ds_config, plan, trainer, data):
        log.info(line)
    for ds in (data.train_set, data.val_set):  # rows dropped up front: missing videos, quarantine.tsv
        listed = ds.write_skipped(run_dir / f"skipped_rows_{ds.split}.txt") if dist.is_main() else None
        log.info(f"data {ds.startup_line()}" + (f" (listed in {listed})" if listed else ""))
    log.info(decoder_note)
    if recipe.checkpoint.resume:
        tag = args.resume_from if args.resume_from and args.resume_from.lower() != "none" else None
        trainer.resume(tag)
    log.truncate_history(trainer.state.global_step)  # rows past the resumed step would be written again
    trainer.fit(data, args.exit_after_steps)
    log.close()
    del trainer, engine
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

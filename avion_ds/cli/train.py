"""`avion-ds train` / `launch/train.py`: train a video model with DeepSpeed from a YAML recipe.

Only wiring. Order of work: :func:`setup_run` (``engine.run_setup``: every check that can fail cheaply,
and the ONE computation of batch plan, steps per epoch and DeepSpeed config) BEFORE the process group,
data workers or model exist; then loaders, model (the task builds it), engine; resume;
``Trainer.fit`` (checkpoint every N steps and at epoch end, evaluate every k epochs); exit through
``dist.shutdown``. What differs between kinds of training is asked of the recipe's task.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

from avion_ds.cli.parsers import train_args as parse_args
from avion_ds.cli.plugins import import_plugins
from avion_ds.config import ConfigError, Recipe, save_recipe
from avion_ds.data import DeviceAugment, build_loader
from avion_ds.data.decode.select import pick_decoder
from avion_ds.data.errors import DataError
from avion_ds.distributed import dist
from avion_ds.distributed.ds_hidden import hidden_size_line
from avion_ds.distributed.run_log import RunLogger
from avion_ds.engine import elastic
from avion_ds.engine import run_checkpoints as ckpt
from avion_ds.engine.oom import OutOfMemory, explain
from avion_ds.engine.parallelize import parallelize
from avion_ds.engine.run_setup import (
    RunSetup,
    backends_line,
    prepare_training,
    seed_everything,
)
from avion_ds.engine.train_state import NonFiniteLoss, TrainData
from avion_ds.engine.trainer import Trainer
from avion_ds.engine.trust import command_trust
from avion_ds.models.listing import gflops_text
from avion_ds.tasks import load_recipe


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


def setup_run(args: argparse.Namespace) -> RunSetup:
    """Every check that can fail cheaply, and the run's resolved setup; no process group, worker or model.
    The ``--plugin`` modules are imported first (their tasks and sections exist before the recipe is read)."""
    import_plugins(args.plugins)
    if args.exit_after_steps is not None and args.exit_after_steps < 1:
        raise ConfigError(f"--exit-after-steps {args.exit_after_steps}: must be >= 1 (optimizer steps)")
    overrides = _recipe_overrides(args)
    recipe = load_recipe(args.config, overrides)
    note = command_trust(recipe, args.config, overrides, [recipe.output_dir, recipe.model.pretrained])
    if note and dist.is_main():
        print(note, flush=True)
    setup = prepare_training(recipe, args.deepspeed_config)
    ckpt.check_run_identity(recipe.output_dir, recipe)
    tag = args.resume_from if args.resume_from is not None and args.resume_from.lower() != "none" else None
    if tag is not None:
        ckpt.check_tag(recipe.output_dir, tag)
    ckpt.check_resume_source(recipe, tag)
    if args.dry_run:
        sm = setup.summary
        print(
            f"# avion-ds train --dry-run: all checks passed | {sm.name} {sm.params / 1e6:.2f}M params, "
            f"{gflops_text(sm.gflops)} GFLOPs/clip, token grid {sm.grid} | world {setup.world} | "
            f"{setup.steps_per_epoch} steps/epoch | {weight_decay_text(recipe)}"
        )
        for ds in (setup.train_set, setup.val_set):
            print(f"# data {ds.startup_line()}")
        filled = hidden_size_line(setup.user_ds, setup.ds_config, recipe.model.name)
        if filled:
            print(f"# {filled}")
        print("# resolved recipe")
        print(yaml.safe_dump(recipe.to_dict(), sort_keys=False), end="")
        print("# DeepSpeed config")
        print(json.dumps(setup.ds_config, indent=2))
    return setup


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------
def build_data(setup: RunSetup, run_dir: Path) -> tuple[TrainData, str]:
    """Loaders over the setup's datasets and the decoder note; all ranks (the process group exists)."""
    recipe, plan = setup.recipe, setup.plan
    # data.decoder=auto: probed once on rank 0, recorded in the run dir so a resume keeps the choice
    picked = pick_decoder(recipe.data, run_dir, recipe.checkpoint.resume) if dist.is_main() else None
    recipe.data.decoder, decoder_note = dist.broadcast_object(picked)
    train_loader = build_loader(
        setup.train_set,
        plan.micro_batch,
        recipe.data.workers,
        shuffle=True,
        seed=recipe.seed,
        drop_last=True,
        distributed=True,
    )
    val_loader = build_loader(
        setup.val_set,
        recipe.eval.batch_size or plan.micro_batch,
        recipe.data.workers,
        shuffle=False,
        seed=recipe.seed,
        drop_last=False,
        distributed=True,
    )
    eval_aug = DeviceAugment(recipe.data, setup.task.label_classes(recipe), train=False)
    return TrainData(
        train_loader, val_loader, setup.train_set, setup.val_set, eval_aug, setup.steps_per_epoch
    ), decoder_note


def weight_decay_text(recipe: Recipe) -> str:
    """The decayed groups' weight decay for the summary line: constant, or ``optim.weight_decay_end``'s cosine,
    said as rising when the end is above the start (allowed: docs/training.md)."""
    o = recipe.optim
    if o.weight_decay_end is None:
        return f"weight decay {o.weight_decay:g}"
    if o.weight_decay_end > o.weight_decay:
        return (
            f"weight decay {o.weight_decay:g} -> {o.weight_decay_end:g} (rising: optim.weight_decay_end > "
            "optim.weight_decay, a cosine up over the run as DINO-style recipes)"
        )
    return f"weight decay {o.weight_decay:g} -> {o.weight_decay_end:g} (cosine)"


def start_lines(setup: RunSetup, trainer: Trainer) -> list[str]:
    """What the run is: task, model, world, ZeRO stage, precision, batch arithmetic, backends."""
    recipe, plan, world = setup.recipe, setup.plan, setup.world
    ac = recipe.model.activation_checkpoint_impl if recipe.model.activation_checkpointing else "off"
    filled = hidden_size_line(setup.user_ds, setup.ds_config, recipe.model.name)  # HF's "auto" bucket sizes
    return [
        (
            f"avion-ds train: {setup.task.name} {recipe.model.name} | world {world} | ZeRO-{setup.ds_plan.zero_stage} | "
            f"{trainer.precision} | global batch {plan.global_batch} = micro {plan.micro_batch} x accum "
            f"{plan.grad_accum} x world {world} | {setup.steps_per_epoch} steps/epoch x {recipe.schedule.epochs} "
            f"epochs | {weight_decay_text(recipe)} | activation checkpointing {ac} | run dir {recipe.output_dir}"
        ),
        backends_line(trainer.engine.module, recipe, trainer.device, trainer.dtype),
        *([filled] if filled else []),
    ]


def run(setup: RunSetup, args: argparse.Namespace) -> int:
    """Wire the run from its setup: process group, loaders, model, engine, ``Trainer.fit``."""
    recipe, task = setup.recipe, setup.task
    rank, world, _ = dist.init()
    if world != setup.world:
        raise ConfigError(f"the process group has {world} ranks but the launcher announced {setup.world}")
    seed_everything(recipe.seed)
    run_dir = Path(recipe.output_dir)
    data, decoder_note = build_data(setup, run_dir)
    if dist.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, run_dir / "recipe.yaml")
        (run_dir / "ds_config.json").write_text(json.dumps(setup.ds_config, indent=2) + "\n")
    ckpt.write_run_identity(run_dir, recipe)

    trust = recipe.model.trust_checkpoint
    resize = elastic.prepare_resume(run_dir, setup.ds_config, trust=trust) if recipe.checkpoint.resume else None
    if resize and dist.is_main():
        print(resize, flush=True)
    model = task.build_model(recipe, run_dir=run_dir, ds_config=setup.ds_config)
    seed_everything(recipe.seed + rank)  # per-rank streams for dropout / augmentation
    parallel = parallelize(model, recipe, setup.ds_config, setup.steps_per_epoch, plan=setup.ds_plan)
    del model
    log = RunLogger(
        run_dir, dist.is_main(), recipe.logging.tensorboard, recipe.logging.progress, recipe.logging.log_every
    )
    augment = DeviceAugment(recipe.data, task.label_classes(recipe), train=True)
    trainer = Trainer(parallel, recipe, task, log=log, augment=augment)
    for line in start_lines(setup, trainer):
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
    del trainer, parallel
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds train` and `launch/train.py`; exits through ``dist.shutdown``."""
    args = parse_args(argv)
    return dist.run_entry(
        "avion-ds train",
        lambda: _run_explaining_oom(args),
        {ConfigError: 2, DataError: 2, NonFiniteLoss: 3, ckpt.NonFiniteWeights: 3, OutOfMemory: 1},
    )


def _run_explaining_oom(args: argparse.Namespace) -> int:
    """Preflight, then ``run``, with an out-of-memory error turned (once) into the one-line ``OutOfMemory``
    that describes THIS run (its setup, overrides included)."""
    setup = setup_run(args)
    if args.dry_run:
        return 0
    try:
        return run(setup, args)
    except torch.OutOfMemoryError as e:
        raise OutOfMemory(explain(setup.recipe, setup.ds_plan, setup.world, e)) from None


if __name__ == "__main__":
    sys.exit(main())

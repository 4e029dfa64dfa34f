"""Out of memory during training: one line with the model, the micro-batch, the planner's
predicted peak for this configuration and the next knob to try, then exit code 1."""

from __future__ import annotations

import argparse
from typing import Any

from avion_ds.config import Recipe


class OutOfMemory(RuntimeError):
    """A device (or host) out-of-memory error, explained; ``avion-ds train`` exits 1 with it."""


def next_knob(recipe: Recipe, ds_config: dict[str, Any], micro_batch: int) -> str:
    """The cheapest change that lowers peak memory, in the order that costs the least speed."""
    m = recipe.model
    zero = ds_config.get("zero_optimization", {})
    if not m.activation_checkpointing or m.checkpoint_every > 1 or m.checkpoint_first_n is not None:
        return ("checkpoint every block (--set model.activation_checkpointing=true --set model.checkpoint_every=1 "
                "--set model.checkpoint_first_n=null)")
    if micro_batch > 1:
        return (f"a smaller micro-batch (--set batch.micro_batch={max(1, micro_batch // 2)}; gradient accumulation "
                "keeps the global batch)")
    if int(zero.get("stage", 0)) < 3:
        return "ZeRO-3 (--deepspeed_config ds_configs/zero3.json)"
    if not zero.get("offload_param") and not zero.get("offload_optimizer"):
        return "ZeRO-3 with CPU offload (--deepspeed_config ds_configs/zero3_offload.json)"
    return "more or larger GPUs (nothing left to trade on this one)"


def explain(recipe: Recipe, ds_config: dict[str, Any], world: int, error: BaseException) -> str:
    """The one-line message for an out-of-memory ``error`` under this recipe and config."""
    from avion_ds.engine.ds_config import precision_of, resolve_batch
    from avion_ds.memory.estimate import estimate
    from avion_ds.memory.units import format_bytes

    micro = resolve_batch(recipe, world).micro_batch
    m = recipe.model
    zero = ds_config.get("zero_optimization", {})
    try:
        e = estimate(m.name, recipe.data.num_frames, recipe.data.size, micro, precision_of(ds_config),
                     int(zero.get("stage", 0)), offload_optimizer=bool(zero.get("offload_optimizer")),
                     offload_param=bool(zero.get("offload_param")),
                     checkpointing=m.checkpoint_every if m.activation_checkpointing else False, world_size=world,
                     first_n=m.checkpoint_first_n)
        predicted = f"planner predicts {format_bytes(e.total)} per GPU for this config"
    except Exception as exc:  # noqa: BLE001 - the message must not fail: say why there is no prediction
        predicted = f"no planner prediction ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"
    what = (str(error).strip().splitlines() or ["out of memory"])[0][:160]
    return (f"out of memory ({what}): model {m.name}, micro-batch {micro} x {recipe.data.num_frames} frames x "
            f"{recipe.data.size} px, ZeRO-{zero.get('stage', 0)}; {predicted}; try {next_knob(recipe, ds_config, micro)}"
            f" (or run `avion-ds plan` for this GPU)")


def explain_from_args(args: argparse.Namespace, error: BaseException) -> str:
    """``explain`` for the recipe and DeepSpeed JSON named on the command line (re-read: cheap)."""
    from avion_ds.config import load_recipe
    from avion_ds.engine import dist
    from avion_ds.engine.ds_config import build_ds_config, load_user_config

    recipe = load_recipe(args.config, args.overrides)
    world = dist.world_size() if dist.is_initialized() else dist.env_world_size()
    ds_config = build_ds_config(load_user_config(args.deepspeed_config), recipe, world, steps_per_epoch=1)
    return explain(recipe, ds_config, world, error)

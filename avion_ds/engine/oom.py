"""Out of memory during training: one line with the model, the micro-batch, the planner's
predicted peak for this configuration and the next knob to try, then exit code 1."""

from __future__ import annotations

from avion_ds.config import Recipe
from avion_ds.distributed.ds_config import resolve_batch
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.memory.estimate import estimate
from avion_ds.memory.units import format_bytes
from avion_ds.tasks import task_of


class OutOfMemory(RuntimeError):
    """A device (or host) out-of-memory error, explained; ``avion-ds train`` exits 1 with it."""


def next_knob(recipe: Recipe, plan: DSPlan, micro_batch: int) -> str:
    """The cheapest change that lowers peak memory, in the order that costs the least speed."""
    m = recipe.model
    if (
        not m.activation_checkpointing
        or m.activation_checkpoint_every > 1
        or m.activation_checkpoint_first_n is not None
    ):
        return (
            "checkpoint every block (--set model.activation_checkpointing=true --set model.activation_checkpoint_every=1 "
            "--set model.activation_checkpoint_first_n=null)"
        )
    if micro_batch > 1:
        return (
            f"a smaller micro-batch (--set batch.micro_batch={max(1, micro_batch // 2)}; gradient accumulation "
            "keeps the global batch)"
        )
    if plan.zero_stage < 3:
        return "ZeRO-3 (--deepspeed_config ds_configs/zero3.json)"
    if not plan.offloads:
        return "ZeRO-3 with CPU offload (--deepspeed_config ds_configs/zero3_offload.json)"
    return "more or larger GPUs (nothing left to trade on this one)"


def explain(recipe: Recipe, plan: DSPlan, world: int, error: BaseException) -> str:
    """The one-line message for an out-of-memory ``error`` under this recipe and DeepSpeed plan."""
    micro = plan.micro_batch if plan.micro_batch is not None else resolve_batch(recipe, world).micro_batch
    clips = micro * recipe.data.num_sample  # repeated sampling: num_sample augmented clips per loaded item
    m = recipe.model
    try:
        knobs = {
            "offload_optimizer": plan.offload_optimizer is not None,
            "offload_param": plan.offload_param is not None,
            "checkpointing": m.activation_checkpoint_every if m.activation_checkpointing else False,
            "world_size": world,
            "first_n": m.activation_checkpoint_first_n,
            "checkpoint_policy": m.activation_checkpoint_policy,
        }
        own = task_of(recipe).memory_estimator(recipe)  # a task's own step (e.g. UMT's teacher)
        if own is not None:
            e = own(clips, plan.precision, plan.zero_stage, **knobs)
        else:
            e = estimate(
                m.name, recipe.data.num_frames, recipe.data.size, clips, plan.precision, plan.zero_stage, **knobs
            )
        predicted = f"planner predicts {format_bytes(e.total)} per GPU for this config"
    except Exception as exc:  # noqa: BLE001 - the message must not fail: say why there is no prediction
        predicted = f"no planner prediction ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"
    what = (str(error).strip().splitlines() or ["out of memory"])[0][:160]
    per = f" ({clips} clips)" if clips != micro else ""
    return (
        f"out of memory ({what}): model {m.name}, micro-batch {micro}{per} x {recipe.data.num_frames} frames x "
        f"{recipe.data.size} px, ZeRO-{plan.zero_stage}; {predicted}; try {next_knob(recipe, plan, micro)}"
        f" (or run `avion-ds plan` for this GPU)"
    )

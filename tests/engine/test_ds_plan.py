"""DSPlan: the built DeepSpeed config read once into a frozen plan (stage, offload, precision, batch, buckets)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from avion_ds.distributed.ds_config import build_ds_config
from avion_ds.distributed.ds_hidden import model_hidden_size
from avion_ds.distributed.ds_plan import DSPlan, Offload
from avion_ds.tasks import load_recipe

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "ds_configs").glob("*.json"))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def recipe(*overrides: str):
    base = ["data.dataset=kinetics", "model.name=vit_test_tiny", "batch.global_batch=32", "batch.micro_batch=4"]
    return load_recipe(None, [*base, "optim.clip_grad=0.5", *overrides])


def json_of(name: str) -> dict:
    return json.loads((REPO / "ds_configs" / f"{name}.json").read_text())


# the offload each shipped JSON states: (param, optimizer)
CPU_PINNED, NVME = Offload("cpu", pin_memory=True), Offload("nvme", pin_memory=True, nvme_path="/local_nvme")
OFFLOADS = {
    "zero0": (None, None),
    "zero1": (None, None),
    "zero2": (None, None),
    "zero2_offload": (None, CPU_PINNED),
    "zero3": (None, None),
    "zero3_offload": (CPU_PINNED, CPU_PINNED),
    "zero3_nvme": (NVME, NVME),
}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_plan_of_each_shipped_config(path: Path, precision: str) -> None:
    """Stage 0-3, offload none / cpu / nvme, each precision, the batch split: as the built dict states them."""
    cfg = build_ds_config(path, recipe(f"precision={precision}"), world_size=2, steps_per_epoch=5)
    plan = DSPlan.of(cfg)
    zo = cfg["zero_optimization"]
    assert plan.zero_stage == int(path.stem[4])
    assert plan.precision == precision and plan.dtype == DTYPES[precision]
    assert (plan.offload_param, plan.offload_optimizer) == OFFLOADS[path.stem]
    assert plan.offloads_optimizer == (OFFLOADS[path.stem][1] is not None)
    assert plan.offloads == any(OFFLOADS[path.stem])
    assert (plan.global_batch, plan.micro_batch, plan.grad_accum, plan.world_size) == (32, 4, 4, 2)
    assert plan.gradient_clipping == 0.5
    assert plan.reduce_bucket_size == zo.get("reduce_bucket_size")
    assert plan.allgather_bucket_size == zo.get("allgather_bucket_size")
    assert plan.prefetch_bucket_size == zo.get("stage3_prefetch_bucket_size")
    assert plan.param_persistence_threshold == zo.get("stage3_param_persistence_threshold")
    assert plan.max_live_parameters == zo.get("stage3_max_live_parameters")
    assert plan.optimizer_type == "AdamW" and plan.optimizer_lr == cfg["optimizer"]["params"]["lr"]
    assert not plan.has_scheduler


def test_auto_buckets_resolved_from_the_hidden_size() -> None:
    """Hugging Face's "auto" bucket sizes: the plan holds the numbers the builder filled, not "auto"."""
    user = json_of("zero3")
    zo = user["zero_optimization"]
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        zo[key] = "auto"
    before = DSPlan.of(user)
    assert (before.reduce_bucket_size, before.prefetch_bucket_size, before.param_persistence_threshold) == (None,) * 3
    assert (before.micro_batch, before.grad_accum, before.global_batch, before.world_size) == (None,) * 4
    assert before.precision == "fp32"  # "enabled": "auto" is not a precision yet
    h = model_hidden_size("vit_test_tiny")
    plan = DSPlan.of(build_ds_config(user, recipe(), world_size=1))
    assert (plan.reduce_bucket_size, plan.prefetch_bucket_size, plan.param_persistence_threshold) == (
        h * h,
        int(0.9 * h * h),
        10 * h,
    )
    assert plan.max_live_parameters == zo["stage3_max_live_parameters"]


def test_plan_without_config_and_with_a_client_optimizer() -> None:
    """None is ZeRO-0 fp32 with nothing offloaded; a config without an optimizer section leaves the
    optimizer to the client; a JSON scheduler is noted."""
    assert DSPlan.of(None) == DSPlan()
    assert (DSPlan().zero_stage, DSPlan().precision, DSPlan().offloads) == (0, "fp32", False)
    cfg = build_ds_config({"zero_optimization": {"stage": 1}}, recipe("precision=bf16"), world_size=4)
    plan = DSPlan.of(cfg)
    assert (plan.optimizer_type, plan.optimizer_lr, plan.precision, plan.world_size) == (None, None, "bf16", 4)
    assert DSPlan.of({"scheduler": {"type": "WarmupLR"}}).has_scheduler
    # an offload section with device "none" offloads nothing
    assert DSPlan.of({"zero_optimization": {"stage": 3, "offload_param": {"device": "none"}}}).offload_param is None


def test_plan_is_frozen_and_hashable() -> None:
    plan = DSPlan.of(build_ds_config(REPO / "ds_configs" / "zero3_offload.json", recipe(), world_size=1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.zero_stage = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.offload_param.device = "nvme"  # type: ignore[union-attr,misc]
    assert hash(plan) == hash(DSPlan.of(build_ds_config(REPO / "ds_configs" / "zero3_offload.json", recipe(), 1)))

"""The DeepSpeed config as a typed, frozen plan: THE one reader of stage, offload, precision, batch, buckets.

``build_ds_config`` writes the dict DeepSpeed is given; :meth:`DSPlan.of` reads it once into a
:class:`DSPlan` (start-up does this right after building, ``RunSetup.ds_plan``), and library code asks
the plan (``plan.zero_stage``, ``plan.offload_param``, ``plan.dtype``) instead of looking keys up in the
dict again. The raw dict still goes to ``deepspeed.initialize`` / ``deepspeed.zero.Init``.

:meth:`DSPlan.of` also reads a user JSON (or None) before it is built: there the fields the JSON leaves
absent or ``"auto"`` are None (batch sizes, buckets) and precision counts only sections enabled ``true``.
The builders that fill a config (``ds_config``, ``ds_optimizer``) read their half-built dict with the
plan's own field readers, :func:`stage_of` and :func:`offload_of`: a plan exists only once the dict is whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from avion_ds.distributed.ds_fields import AUTO, torch_dtype


@dataclass(frozen=True)
class Offload:
    """Where ZeRO keeps the parameters or the optimizer state off the accelerator."""

    device: str  # cpu | nvme
    pin_memory: bool = False
    nvme_path: str | None = None


@dataclass(frozen=True)
class DSPlan:
    """What a DeepSpeed config decides, resolved once (see module doc)."""

    zero_stage: int = 0
    precision: str = "fp32"  # fp32 | bf16 | fp16
    offload_param: Offload | None = None
    offload_optimizer: Offload | None = None
    micro_batch: int | None = None  # train_micro_batch_size_per_gpu
    grad_accum: int | None = None  # gradient_accumulation_steps
    global_batch: int | None = None  # train_batch_size = micro x accum x world
    gradient_clipping: float = 0.0  # 0: none (DeepSpeed's own default of 1.0 never applies: the builder writes it)
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    prefetch_bucket_size: int | None = None  # stage3_prefetch_bucket_size
    param_persistence_threshold: int | None = None  # stage3_param_persistence_threshold
    max_live_parameters: int | None = None  # stage3_max_live_parameters
    optimizer_type: str | None = None  # the JSON optimizer section's type (None: no section, a client optimizer)
    optimizer_lr: float | None = None  # its (filled) lr
    has_scheduler: bool = False  # a JSON scheduler section (else the built-in warmup + cosine)

    @classmethod
    def of(cls, cfg: Mapping[str, Any] | None) -> DSPlan:
        """The plan of a DeepSpeed config (built or user JSON; None: the empty config, ZeRO-0 fp32)."""
        cfg = cfg or {}
        zo = cfg.get("zero_optimization") or {}
        opt = cfg.get("optimizer")
        lr = ((opt or {}).get("params") or {}).get("lr")
        return cls(
            zero_stage=stage_of(cfg),
            precision=_precision(cfg),
            offload_param=offload_of(cfg, "param"),
            offload_optimizer=offload_of(cfg, "optimizer"),
            micro_batch=_number(cfg.get("train_micro_batch_size_per_gpu"), int),
            grad_accum=_number(cfg.get("gradient_accumulation_steps"), int),
            global_batch=_number(cfg.get("train_batch_size"), int),
            gradient_clipping=_number(cfg.get("gradient_clipping"), float) or 0.0,
            reduce_bucket_size=_number(zo.get("reduce_bucket_size"), int),
            allgather_bucket_size=_number(zo.get("allgather_bucket_size"), int),
            prefetch_bucket_size=_number(zo.get("stage3_prefetch_bucket_size"), int),
            param_persistence_threshold=_number(zo.get("stage3_param_persistence_threshold"), int),
            max_live_parameters=_number(zo.get("stage3_max_live_parameters"), int),
            optimizer_type=None if opt is None else str(opt.get("type", "")),
            optimizer_lr=_number(lr, float),
            has_scheduler="scheduler" in cfg,
        )

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype of the plan's precision."""
        return torch_dtype(self.precision)

    @property
    def offloads_optimizer(self) -> bool:
        """True when the optimizer state lives on CPU/NVMe (DeepSpeed then uses its CPU Adam)."""
        return self.offload_optimizer is not None

    @property
    def offloads(self) -> bool:
        """True when ZeRO offloads the parameters or the optimizer state."""
        return self.offload_param is not None or self.offload_optimizer is not None

    @property
    def world_size(self) -> int | None:
        """Data-parallel ranks the batch split implies (global / (micro x accum)); None when unknown."""
        if not (self.global_batch and self.micro_batch and self.grad_accum):
            return None
        return self.global_batch // (self.micro_batch * self.grad_accum)


def stage_of(cfg: Mapping[str, Any] | None) -> int:
    """ZeRO stage of a (built or user) config; 0 when there is none."""
    return int(((cfg or {}).get("zero_optimization") or {}).get("stage", 0))


def offload_of(cfg: Mapping[str, Any] | None, what: str) -> Offload | None:
    """Where ZeRO offloads ``what`` (``"optimizer"`` | ``"param"``): an :class:`Offload` to cpu | nvme, or None."""
    section = (((cfg or {}).get("zero_optimization") or {}).get(f"offload_{what}")) or {}
    device = section.get("device")
    if device not in ("cpu", "nvme"):
        return None
    path = section.get("nvme_path")
    return Offload(str(device), bool(section.get("pin_memory", False)), None if path is None else str(path))


def _precision(cfg: Mapping[str, Any]) -> str:
    for name in ("bf16", "fp16"):
        enabled = (cfg.get(name) or {}).get("enabled")
        if enabled and enabled != AUTO:
            return name
    return "fp32"


def _number(value: Any, kind: type) -> Any:
    """``value`` as ``kind`` (int | float); None when absent or "auto" (a user JSON, before it is built)."""
    if value is None or value == AUTO or isinstance(value, bool):
        return None
    return kind(value)

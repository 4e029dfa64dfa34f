"""ZeRO-3 partitioned construction: build a model so that no rank ever holds all of it.

DeepSpeed moves a ZeRO-3 model whose parameters lack ``ds_id`` WHOLE to the accelerator before
partitioning it (``engine._configure_distributed_model``), and every rank first builds the full
fp32 model in host RAM. Building under ``deepspeed.zero.Init`` partitions each parameter as its
module's ``__init__`` returns. Three consequences the model code must respect (helpers below):

* a partitioned ``p.data`` is empty: shapes / element counts come from ``ds_shape`` / ``ds_numel``
  (:func:`full_shape`, :func:`full_numel`, :func:`full_ndim`);
* weight init that runs after a child's ``__init__`` sees empty tensors: run it inside
  :func:`gathered` (all ranks draw the same random numbers; rank 0's values are kept);
* ``torch.arange`` / ``zeros`` / ``empty`` inside ``__init__`` are patched to the run's dtype
  (bf16 collapses positions >= 256), so fixed tables use integer ``arange`` and an explicit cast.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.distributed.malloc import pin_mmap_threshold


def is_partitioned(p: torch.Tensor) -> bool:
    """True for a ZeRO-3 parameter (built under ``zero.Init`` or converted by DeepSpeed)."""
    return hasattr(p, "ds_id")


def is_partitioned_model(model: nn.Module) -> bool:
    return any(is_partitioned(p) for p in model.parameters())


def full_shape(p: torch.Tensor) -> torch.Size:
    """The parameter's logical shape, also when its data is a (possibly empty) ZeRO-3 partition."""
    return p.ds_shape if is_partitioned(p) else p.shape


def full_numel(p: torch.Tensor) -> int:
    return int(p.ds_numel) if is_partitioned(p) else p.numel()


def full_ndim(p: torch.Tensor) -> int:
    return len(full_shape(p))


def param_count(model: nn.Module) -> int:
    """Number of parameter elements of the whole model (partitioned, meta or real)."""
    return sum(math.prod(full_shape(p)) for p in model.parameters())


def gathered(params: Iterable[torch.Tensor], modifier_rank: int | None = 0) -> contextlib.AbstractContextManager:
    """Full tensors of ``params`` inside the context; a no-op unless some are partitioned.

    With ``modifier_rank`` set, that rank's modifications are broadcast and re-partitioned on exit.
    """
    params = [p for p in params if p is not None]
    if not any(is_partitioned(p) for p in params):
        return contextlib.nullcontext()
    import deepspeed  # lazy: heavy, only partitioned (ZeRO-3) parameters need it

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


def zero_init(ds_config: dict[str, Any]) -> Any:
    """``deepspeed.zero.Init`` for ``ds_config`` whose parameter dtype is the config's own.

    The dtype is left for DeepSpeed to read from the config (``dtype=None``): DeepSpeed 0.19.8's
    ``Init._set_dtype`` evaluates ``dtype or fp16 if accelerator.is_fp16_supported() else bf16 ...``,
    which drops an EXPLICIT dtype whenever the accelerator reports no fp16 (a CPU without oneDNN
    fp16, e.g. AMD EPYC) and builds the parameters in bf16 under an fp32 config. The resolved dtype
    is then checked before anything is built.
    """
    import deepspeed  # lazy: heavy, only ZeRO-3 construction needs it

    plan = DSPlan.of(ds_config)
    offload = plan.offload_param
    init = deepspeed.zero.Init(
        config_dict_or_path=ds_config,
        remote_device=None if offload is None else offload.device,
        pin_memory=offload is not None and offload.pin_memory,
        dtype=None,
    )
    want = plan.dtype
    if init.dtype != want:  # a DeepSpeed that resolves it otherwise: refuse rather than build in the wrong dtype
        raise RuntimeError(f"deepspeed.zero.Init resolved parameter dtype {init.dtype} for a {want} config")
    return init


@contextlib.contextmanager
def partitioned_construction(ds_config: dict[str, Any] | None) -> Iterator[bool]:
    """Construct modules partitioned when ``ds_config`` is ZeRO-3 (yields True), plainly otherwise.

    Wrap ANY model construction (``create_model``, pretraining models) in it; the model must then
    be handed to ``deepspeed.initialize`` with the same config. Needs a process group.
    """
    if DSPlan.of(ds_config).zero_stage != 3:
        yield False
        return
    assert ds_config is not None
    pin_mmap_threshold()
    with zero_init(ds_config):
        yield True


def state_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """``state_dict`` names -> logical shapes (parameters' ``ds_shape`` when partitioned)."""
    params = dict(model.named_parameters())
    return {k: full_shape(params[k]) if k in params else v.shape for k, v in model.state_dict().items()}

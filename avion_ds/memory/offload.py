"""Layer-streaming inference: evaluate a model whose weights exceed the GPU budget through
DeepSpeed ZeRO-3 parameter offload (no home-made scheduler).

Weights live partitioned in CPU memory (or on NVMe); ZeRO-3's forward hooks gather each module's
parameters onto the device just before it runs and release them after, prefetching ahead.
Two knobs trade memory for speed:

* ``max_live_parameters`` (``stage3_max_live_parameters``): how many parameters may be resident
  on the device at once. Small -> less GPU memory, more re-fetching.
* ``prefetch_bucket_size`` (``stage3_prefetch_bucket_size``): how many parameters are fetched
  ahead of use. Large -> more overlap of PCIe transfer with compute, more memory.

Logits equal the plain model's (same weights, same kernels); tests check allclose on 2 CPU ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from avion_ds.distributed import dist
from avion_ds.distributed.ds_config import build_ds_config, fixed_batch_recipe, reference_config
from avion_ds.distributed.ds_fields import torch_dtype
from avion_ds.memory.estimate import arch_info
from avion_ds.models import create_model
from avion_ds.models.partition import is_partitioned_model
from avion_ds.models.weights.loading import build_partitioned

OFFLOAD_DEVICES = ("cpu", "nvme")


INFERENCE_KNOBS = (
    "max_live_parameters",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "pin_memory",
    "nvme_path",
)  # what an inference config changes in its reference JSON (+ no optimizer)


def inference_ds_config(
    offload: str = "cpu",
    max_live_parameters: int = 100_000_000,
    prefetch_bucket_size: int = 50_000_000,
    nvme_path: str | None = None,
    dtype: torch.dtype = torch.float32,
    param_persistence_threshold: int = 0,
    pin_memory: bool | None = None,
) -> dict[str, Any]:
    """The inference-only DeepSpeed config (ZeRO-3, parameter offload, no optimizer), built by
    ``build_ds_config`` from ``ds_configs/zero3_offload.json`` (``zero3_nvme.json`` for NVMe) with
    only :data:`INFERENCE_KNOBS` changed and the optimizer sections removed; micro-batch 1.
    ``train_batch_size`` is left to DeepSpeed (1 x its world size)."""
    if offload not in OFFLOAD_DEVICES:
        raise ValueError(f"offload={offload!r} is not one of {', '.join(OFFLOAD_DEVICES)}")
    for key, value in (("max_live_parameters", max_live_parameters), ("prefetch_bucket_size", prefetch_bucket_size)):
        if int(value) <= 0:
            raise ValueError(f"{key}={value} must be a positive number of parameters")
    if offload == "nvme" and not nvme_path:
        raise ValueError("offload='nvme' needs nvme_path (a directory on a fast local disk)")
    base = reference_config("zero3_nvme" if offload == "nvme" else "zero3_offload")
    param: dict[str, Any] = {"pin_memory": bool(torch.cuda.is_available() if pin_memory is None else pin_memory)}
    if offload == "nvme":
        param["nvme_path"] = str(nvme_path)
        if int(prefetch_bucket_size) > base["zero_optimization"]["offload_param"].get("buffer_size", 0):
            param["buffer_size"] = int(prefetch_bucket_size)  # a prefetch must fit one swap buffer
    overrides = {
        "optimizer": None,
        "zero_optimization": {
            "offload_optimizer": None,
            "offload_param": param,
            "stage3_max_live_parameters": int(max_live_parameters),
            "stage3_prefetch_bucket_size": int(prefetch_bucket_size),
            "stage3_param_persistence_threshold": int(param_persistence_threshold),
            "stage3_max_reuse_distance": int(max_live_parameters),
        },
    }
    precision = next((p for p in ("bf16", "fp16") if torch_dtype(p) == dtype), "fp32")
    cfg = build_ds_config(base, fixed_batch_recipe(1, 1, precision), 1, overrides=overrides)
    del cfg["train_batch_size"]  # micro 1 x accum 1 x the live world size, which DeepSpeed knows
    return cfg


class OffloadedInference(nn.Module):
    """Wraps the DeepSpeed engine: ``forward(x)`` casts ``x`` to the compute device/dtype and runs
    the model without autograd, its weights streamed in per module by ZeRO-3."""

    def __init__(self, engine: Any, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.engine = engine
        self.dtype = dtype
        self.device = device

    @property
    def module(self) -> nn.Module:
        return self.engine.module

    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        with torch.no_grad():
            return self.engine(x.to(device=self.device, dtype=self.dtype, non_blocking=True))


def wrap_for_inference(model: nn.Module, **knobs: Any) -> OffloadedInference:
    """Partition ``model``'s weights to ``offload`` ("cpu" | "nvme") with ZeRO-3 and return a module
    whose ``forward(x)`` gives the plain model's outputs (eval mode, no autograd).

    ``knobs``: the keyword arguments of :func:`inference_ds_config` (offload, max_live_parameters,
    prefetch_bucket_size, nvme_path, dtype, param_persistence_threshold, pin_memory); ``dtype`` is the
    compute dtype (bf16/fp16 enable DeepSpeed's 16-bit mode; default: the model's current dtype).
    Every rank must pass a model with the same weights (e.g. loaded from the same checkpoint); under
    several ranks each holds 1/world of the weights and all ranks must call forward together (the
    same number of batches; a padded DistributedSampler guarantees it).
    """
    import deepspeed  # lazy: deepspeed takes seconds to import
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import

    first = next(model.parameters(), None)
    if knobs.get("dtype") is None:
        knobs["dtype"] = first.dtype if first is not None else torch.float32
    dtype = knobs["dtype"]
    cfg = inference_ds_config(**knobs)
    dist.init()  # a plain single-process call gets the one-rank env a launcher would set
    model.eval()
    if dtype == torch.float32 and not is_partitioned_model(model):  # built by build_for_inference: as is
        model.float()
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
    engine.eval()
    device = torch.device(get_accelerator().current_device_name())
    return OffloadedInference(engine, dtype, device)


def build_for_inference(
    factory: Callable[[], nn.Module], pretrained: str | Path | dict | None = None, strict: bool = False, **knobs: Any
) -> OffloadedInference:
    """Like :func:`wrap_for_inference` (same ``knobs``; ``dtype`` defaults to float32 here), but the
    model is CONSTRUCTED partitioned (``zero.Init`` with the inference config) and ``pretrained`` is
    loaded module by module (rank 0 reads), so no rank ever holds the whole model. ``factory``
    builds the bare model (no weights loaded)."""
    knobs["dtype"] = knobs.get("dtype") or torch.float32
    cfg = inference_ds_config(**knobs)
    dist.init()  # a plain single-process call gets the one-rank env a launcher would set
    model = build_partitioned(factory, cfg, pretrained, strict=strict)
    return wrap_for_inference(model, **knobs)


class ResidentParams:
    """Counts parameter elements resident (ZeRO status AVAILABLE: gathered, on the compute device)
    at every module's forward, after DeepSpeed's own pre-forward hook fetched that module (hooks
    registered after ``deepspeed.initialize`` run after DeepSpeed's). ``peak`` is the largest sum."""

    def __init__(self, model: nn.Module) -> None:
        from deepspeed.runtime.zero.partition_parameters import (  # lazy: deepspeed takes seconds to import
            ZeroParamStatus,
        )

        self.available = ZeroParamStatus.AVAILABLE
        self.params = [p for p in model.parameters() if hasattr(p, "ds_status")]
        self.total = sum(int(p.ds_numel) for p in self.params)
        self.peak = 0
        self.handles = [m.register_forward_pre_hook(self._count) for m in model.modules()]

    def _count(self, module: nn.Module, args: Any) -> None:
        now = sum(int(p.ds_numel) for p in self.params if p.ds_status == self.available)
        self.peak = max(self.peak, now)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def resident_peaks(model_name: str, frames: int, size: int, max_live: list[int]) -> list[dict[str, Any]]:
    """For each ``stage3_max_live_parameters`` value (prefetch bucket = half of it): build the model
    partitioned for CPU-offloaded inference and count the peak resident parameter elements of the
    second forward (the first records DeepSpeed's trace). One process; needs no launcher."""
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import

    dist.init()  # a plain single-process call gets the one-rank env a launcher would set
    x = torch.randn(1, 3, frames, size, size, device=get_accelerator().current_device_name())
    largest = arch_info(model_name, frames, size).largest_layer_params
    rows = []
    for live in max_live:
        torch.manual_seed(0)
        runner = build_for_inference(
            lambda: create_model(model_name, num_frames=frames, img_size=size),
            None,
            max_live_parameters=live,
            prefetch_bucket_size=max(live // 2, 1),
        )
        counter = ResidentParams(runner.module)
        runner(x)
        counter.peak = 0
        runner(x)
        counter.remove()
        rows.append(
            {
                "model": model_name,
                "params": counter.total,
                "max_live_parameters": live,
                "prefetch_bucket_size": max(live // 2, 1),
                "peak_resident": counter.peak,
                "largest_module": largest,
                "frames": frames,
                "size": size,
            }
        )
    return rows


def stream_logits(
    model: nn.Module | OffloadedInference,
    batches: torch.Tensor | Iterable[torch.Tensor],
    **offload_kwargs: Any,
) -> Any:
    """Layer-streaming evaluation in one call: logits for one batch (a tensor) or a list of them
    (an iterable of tensors), wrapping ``model`` with :func:`wrap_for_inference` unless it already is.
    Outputs are moved to the CPU (a tensor, or a dict of tensors for multi-head models)."""
    runner = model if isinstance(model, OffloadedInference) else wrap_for_inference(model, **offload_kwargs)

    def _cpu(out: Any) -> Any:
        return {k: v.float().cpu() for k, v in out.items()} if isinstance(out, dict) else out.float().cpu()

    if isinstance(batches, torch.Tensor):
        return _cpu(runner(batches))
    return [_cpu(runner(b)) for b in batches]

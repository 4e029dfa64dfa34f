"""Real training steps on a CUDA GPU to check the planner: clips/s, peak allocated memory, MFU.

Used by ``avion-ds plan --measure`` and by ``bench/gpu_suite.sh``. Each probe builds the model,
applies activation checkpointing, initialises DeepSpeed with the candidate's config (batch sizes
and optimizer values filled in here), runs warm-up + timed steps on random clips and reports
``torch.cuda.max_memory_allocated`` (what :class:`MemoryEstimate.allocated_peak` predicts).
Probes run in the calling process with its world size (one GPU unless started by a launcher).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch

# dense 16-bit tensor-core peaks (TFLOPS) for MFU; unknown GPUs fall back to --peak-tflops
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0,
               "RTX 4090": 165.0, "RTX 3090": 71.0, "V100": 125.0}


def gpu_peak_tflops(default: float = 0.0) -> float:
    """Dense bf16/fp16 peak of the current GPU from its name (``default`` when unknown)."""
    if not torch.cuda.is_available():
        return default
    name = torch.cuda.get_device_name()
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    return default


def _fill_config(cfg: dict[str, Any], micro: int, accum: int, world: int, dtype: str) -> dict[str, Any]:
    """The candidate's JSON through the one builder, for a probe: batch shape and precision from the
    arguments, the recipe's default optimizer values; torch AdamW unless the optimizer is offloaded
    (no FusedAdam JIT build, which needs nvcc)."""
    from avion_ds.engine.ds_config import (
        build_ds_config,
        fixed_batch_recipe,
        offloads_optimizer,
    )

    opt: dict[str, Any] = {} if "optimizer" in cfg else {"type": "AdamW"}
    if not offloads_optimizer(cfg):
        opt["params"] = {"torch_adam": True}
    return build_ds_config(cfg, fixed_batch_recipe(micro, accum, dtype), world, overrides={"optimizer": opt})


def train_step_probe(
    model_name: str,
    frames: int,
    size: int,
    micro_batch: int,
    ds_config: dict[str, Any] | None = None,
    *,
    dtype: str = "bf16",
    checkpoint_every: int = 0,
    attn_backend: str = "auto",
    grad_accum: int = 1,
    warmup: int = 1,
    steps: int = 3,
    peak_tflops: float | None = None,
) -> dict[str, Any]:
    """Run ``warmup + steps`` optimizer steps; returns clips/s, step time, peak memory, MFU, or
    ``{"oom": True}`` when the step does not fit. CUDA only (RuntimeError otherwise)."""
    if not torch.cuda.is_available():
        raise RuntimeError("train_step_probe needs a CUDA GPU; none is visible")
    import deepspeed
    import torch.distributed as dist
    import torch.nn.functional as F

    from avion_ds.engine import dist as engine_dist
    from avion_ds.models import (
        apply_activation_checkpointing,
        create_model,
        model_flops,
    )
    from avion_ds.models.partition import partitioned_construction

    engine_dist.init()
    world = dist.get_world_size()
    cfg = _fill_config(ds_config or {"zero_optimization": {"stage": 0}}, micro_batch, grad_accum, world, dtype)
    result: dict[str, Any] = {"model": model_name, "frames": frames, "size": size, "micro_batch": micro_batch, "dtype": dtype,
                                  "zero_stage": cfg.get("zero_optimization", {}).get("stage", 0),
                                  "checkpoint_every": checkpoint_every, "attn_backend": attn_backend, "world_size": world}
    engine = model = None
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        stage3 = result["zero_stage"] == 3
        # ZeRO-3 is built partitioned (zero.Init: nothing full on any rank); the others on the GPU (fast)
        with torch.device("cpu" if stage3 else "cuda"), partitioned_construction(cfg):
            model = create_model(model_name, num_frames=frames, img_size=size, attn_backend=attn_backend,
                                 num_classes=400)
        if checkpoint_every:
            apply_activation_checkpointing(model, every=checkpoint_every)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()], config=cfg)
        gc.collect()
        torch.cuda.reset_peak_memory_stats()  # the peak of the steps, not of fp32 construction
        device = engine.device
        cdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
        x = torch.randn(micro_batch, 3, frames, size, size, device=device, dtype=cdtype)
        y = torch.randint(0, 400, (micro_batch,), device=device)
        times = []
        for i in range(warmup + steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(grad_accum):
                loss = F.cross_entropy(engine(x).float(), y)
                engine.backward(loss)
                engine.step()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        step_s = sorted(times)[len(times) // 2]
        clips = micro_batch * grad_accum / step_s
        r = len(range(0, model.depth, checkpoint_every)) / model.depth if checkpoint_every else 0.0
        achieved = clips * model_flops(model_name, num_frames=frames, img_size=size) * (3 + r) / 1e12
        peak = peak_tflops if peak_tflops is not None else gpu_peak_tflops()
        result.update(oom=False, step_s=step_s, clips_per_s=clips, achieved_tflops=achieved,
                      mfu=(achieved / peak if peak else None),
                      peak_allocated=int(torch.cuda.max_memory_allocated()),
                      peak_reserved=int(torch.cuda.max_memory_reserved()))
    except torch.cuda.OutOfMemoryError:
        result.update(oom=True)
    except RuntimeError as e:  # DeepSpeed wraps some OOMs; other errors are reported, not raised
        result.update(oom="out of memory" in str(e).lower(), error=str(e).splitlines()[0][:300])
    finally:
        if engine is not None and hasattr(engine, "destroy"):
            try:
                engine.destroy()
            except Exception as e:  # noqa: BLE001 - best-effort cleanup between probes
                result.setdefault("cleanup_error", str(e)[:200])
        del engine, model
        gc.collect()
        torch.cuda.empty_cache()
    return result

"""Real training steps on a CUDA GPU to check the planner: clips/s, peak allocated memory, MFU.

Used by ``avion-ds plan --measure`` and by ``bench/gpu_suite.sh``. Each probe builds the model and
the engine as ``avion-ds train`` does (the task's ``build_model`` + ``parallelize``, with the candidate's config:
batch sizes and optimizer values filled in here), runs warm-up + timed steps of the training loop's
own step (``Trainer.train_step``) on random clips and reports the accelerator's max allocated memory
(what :class:`MemoryEstimate.allocated_peak` predicts).
Probes run in the calling process with its world size (one GPU unless started by a launcher).
"""

from __future__ import annotations

import gc
import itertools
import time
from typing import Any

import torch

from avion_ds.distributed import dist
from avion_ds.distributed.ds_config import build_ds_config, fixed_batch_recipe
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.engine.parallelize import inner_module, parallelize
from avion_ds.engine.trainer import Trainer
from avion_ds.memory.plan import Candidate, Request, ds_config_for
from avion_ds.models import model_flops
from avion_ds.tasks import load_recipe, task_of

# dense 16-bit tensor-core peaks (TFLOPS) for MFU; unknown GPUs fall back to --peak-tflops
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10": 125.0,
    "L4": 121.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "V100": 125.0,
}


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
    opt: dict[str, Any] = {} if "optimizer" in cfg else {"type": "AdamW"}
    if not DSPlan.of(cfg).offloads_optimizer:
        opt["params"] = {"torch_adam": True}
    return build_ds_config(cfg, fixed_batch_recipe(micro, accum, dtype), world, overrides={"optimizer": opt})


def probe_recipe(
    model_name: str,
    frames: int,
    size: int,
    micro_batch: int,
    grad_accum: int,
    world: int,
    dtype: str,
    checkpoint_every: int = 0,
    attn_backend: str = "auto",
    checkpoint_policy: str = "full",
) -> Any:
    """The recipe a probe trains with: the candidate's model, clip shape, batch and checkpointing."""
    return load_recipe(
        None,
        [
            f"model.name={model_name}",
            "model.num_classes=400",
            "data.dataset=kinetics",
            "model.drop_path_rate=0.0",
            f"model.attn_backend={attn_backend}",
            f"model.activation_checkpointing={str(bool(checkpoint_every)).lower()}",
            f"model.activation_checkpoint_every={max(1, checkpoint_every)}",
            f"model.activation_checkpoint_policy={checkpoint_policy}",
            f"data.num_frames={frames}",
            f"data.size={size}",
            f"batch.micro_batch={micro_batch}",
            f"batch.global_batch={micro_batch * grad_accum * world}",
            f"precision={dtype}",
            "optim.clip_grad=0.0",
            "logging.log_every=1000000000",
            "logging.tensorboard=false",
            "logging.progress=false",
        ],
    )


def _median_step_s(trainer: Trainer, batches: Any, accel: Any, warmup: int, steps: int) -> float:
    """Median wall time of ``steps`` training steps after ``warmup`` untimed ones."""
    times = []
    for i in range(warmup + steps):
        accel.synchronize()
        t0 = time.perf_counter()
        trainer.train_step(batches)
        accel.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


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
    checkpoint_policy: str = "full",
    grad_accum: int = 1,
    warmup: int = 1,
    steps: int = 3,
    peak_tflops: float | None = None,
) -> dict[str, Any]:
    """Run ``warmup + steps`` optimizer steps of the TRAINING step (``Trainer.train_step`` on an engine
    built as ``avion-ds train`` builds it: ``Task.build_model`` + ``parallelize``) on random clips; returns
    clips/s, step time, peak memory, MFU, or ``{"oom": True}`` when the step does not fit. Meant for a
    CUDA GPU (``plan --measure`` refuses without one); runs on any DeepSpeed accelerator."""
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import

    dist.init()
    world = dist.world_size()
    cfg = _fill_config(ds_config or {"zero_optimization": {"stage": 0}}, micro_batch, grad_accum, world, dtype)
    plan = DSPlan.of(cfg)
    result: dict[str, Any] = {"model": model_name, "frames": frames, "size": size, "micro_batch": micro_batch}
    result.update(dtype=dtype, zero_stage=plan.zero_stage, checkpoint_every=checkpoint_every)
    result.update(attn_backend=attn_backend, world_size=world, checkpoint_policy=checkpoint_policy)
    ckpt = (checkpoint_every, attn_backend, checkpoint_policy)
    recipe = probe_recipe(model_name, frames, size, micro_batch, grad_accum, world, dtype, *ckpt)
    task = task_of(recipe)
    accel = get_accelerator()
    engine = parallel = None
    gc.collect()
    accel.empty_cache()
    try:
        model = task.build_model(recipe, ds_config=cfg)
        parallel = parallelize(model, recipe, cfg, steps_per_epoch=warmup + steps, plan=plan)
        engine = parallel.engine
        gc.collect()
        accel.reset_peak_memory_stats()  # the peak of the steps, not of fp32 construction
        trainer = Trainer(parallel, recipe, task)
        batches = itertools.repeat(task.synthetic_batch(recipe, micro_batch, engine.device))
        step_s = _median_step_s(trainer, batches, accel, warmup, steps)
        clips = micro_batch * grad_accum / step_s
        depth = inner_module(engine).depth
        r = len(range(0, depth, checkpoint_every)) / depth if checkpoint_every else 0.0
        achieved = clips * model_flops(model_name, num_frames=frames, img_size=size) * (3 + r) / 1e12
        peak = peak_tflops if peak_tflops is not None else gpu_peak_tflops()
        result.update(
            oom=False,
            step_s=step_s,
            clips_per_s=clips,
            achieved_tflops=achieved,
            mfu=(achieved / peak if peak else None),
            peak_allocated=int(accel.max_memory_allocated()),
            peak_reserved=int(accel.max_memory_reserved()),
        )
    except torch.OutOfMemoryError:
        result.update(oom=True)
    except RuntimeError as e:  # DeepSpeed wraps some OOMs; other errors are reported, not raised
        result.update(oom="out of memory" in str(e).lower(), error=str(e).splitlines()[0][:300])
    finally:
        if engine is not None and hasattr(engine, "destroy"):
            try:
                engine.destroy()
            except Exception as e:  # noqa: BLE001 - best-effort cleanup between probes
                result.setdefault("cleanup_error", str(e)[:200])
        del engine, parallel
        gc.collect()
        accel.empty_cache()
    return result


def measure_candidates(cands: list[Candidate], req: Request, steps: int = 3) -> None:
    """Probe each planner candidate (one GPU: per-GPU memory and speed; gradient accumulation 1)
    and store measured clips/s (scaled to ``req.gpus``, communication not included) and peak."""
    for c in cands:
        res = train_step_probe(
            req.model,
            req.frames,
            req.size,
            c.micro_batch,
            ds_config_for(c, req.nvme_path),
            dtype=req.dtype,
            checkpoint_every=c.checkpoint_every,
            checkpoint_policy=c.checkpoint_policy,
            steps=steps,
        )
        if res.get("oom") or "clips_per_s" not in res:
            c.measured_clips_per_s, c.measured_peak = 0.0, None
            continue
        c.measured_clips_per_s = res["clips_per_s"] * req.gpus / res["world_size"]
        c.measured_peak = res["peak_allocated"]

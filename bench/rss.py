"""Per-rank host memory (RSS) of building, loading and wrapping a model with ZeRO-3.

Run one process per rank (``python -m torch.distributed.run --nproc_per_node 2 -m
bench.rss ...``); rank 0 writes the JSON. Stages: ``build`` (construct the model),
``load`` (pretrained weights from ``--pretrained``), ``init`` (``deepspeed.initialize`` without an
optimizer: the inference / offload path) and, with ``--optimizer``, ``step`` (ZeRO-3 + Adam: one
training step, so fp32 master, grads and moments exist; ``--sgd``: a client ``torch.optim.SGD``
without momentum, which keeps no state, and ``--steps 0``: save right after initialize, so a
checkpoint of a model whose Adam run does not fit here can still be written). ``--mode before`` builds every rank's
full model and loads with ``load_weights`` (what the code did before partitioned construction);
``--mode after`` uses ``zero.Init`` and the module-by-module loader. ``--train-path fp32|bf16``: the
training command's own construction instead (recipe -> ``build_ds_config(ds_configs/zero3.json)`` ->
``task.build_model`` -> ``parallelize``, with its optimizer groups and DeepSpeed's JSON optimizer), stages
``build`` and ``init``.

Peaks are per stage: anonymous and file-backed RSS sampled from /proc/self/status every 2 ms
(``RssAnon`` / ``RssFile``) and the kernel's exact total peak (``VmHWM``, reset per stage
through /proc/self/clear_refs). Values are bytes above the baseline taken after imports, process
group and a warm-up build of a tiny model.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) * 1024
    return out


class RssSampler:
    """Background sampler of anonymous / file-backed RSS peaks; ``stage()`` closes one stage."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak_anon = self.peak_file = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.baseline = self._reset()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            s = _status()
            with self._lock:
                self.peak_anon = max(self.peak_anon, s["RssAnon"])
                self.peak_file = max(self.peak_file, s["RssFile"] + s.get("RssShmem", 0))
            time.sleep(self.interval)

    def _reset(self) -> dict[str, int]:
        gc.collect()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            pass
        s = _status()
        with self._lock:
            self.peak_anon, self.peak_file = s["RssAnon"], s["RssFile"] + s.get("RssShmem", 0)
        return s

    def stage(self) -> dict[str, int]:
        """Peaks since the previous stage, relative to the baseline; starts the next stage."""
        s = _status()
        b = self.baseline
        with self._lock:
            anon, file = max(self.peak_anon, s["RssAnon"]), max(self.peak_file, s["RssFile"] + s.get("RssShmem", 0))
        out = {
            "peak_total": s["VmHWM"] - b["VmRSS"],
            "peak_anon": anon - b["RssAnon"],
            "peak_file": file - b["RssFile"] - b.get("RssShmem", 0),
            "now_total": s["VmRSS"] - b["VmRSS"],
        }
        self._reset()
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _ds_config(world: int, optimizer: bool, sgd: bool = False) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    if optimizer and sgd:
        cfg["zero_allow_untested_optimizer"] = True  # the client torch.optim.SGD below
    elif optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.05, "torch_adam": True}}
    return cfg


def run(args: argparse.Namespace) -> dict[str, Any]:
    import deepspeed
    import torch.distributed as dist

    from avion_ds.distributed.dist import unlink_shm_buffer
    from avion_ds.models import create_model, load_weights
    from avion_ds.models.partition import param_count, partitioned_construction

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    unlink_shm_buffer()
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = _ds_config(world, args.optimizer, args.sgd)
    partitioned = args.mode == "after"
    kw = {"num_frames": args.frames, "img_size": args.size}
    # warm-up: first-use imports and allocator set-up happen before the baseline
    with partitioned_construction(cfg if partitioned else None):
        warm = create_model("vit_test_tiny")
    del warm
    torch.manual_seed(0)
    dist.barrier()
    sampler = RssSampler()
    stages: dict[str, Any] = {}
    with partitioned_construction(cfg if partitioned else None):
        model = create_model(args.model, **kw)
    stages["build"] = sampler.stage()
    if args.pretrained:
        report = load_weights(model, args.pretrained)  # plain or partitioned: read from the model
        stages["load"] = sampler.stage()
        stages["load"]["report"] = report.summary()
    params = param_count(model)
    dist.barrier()
    if args.no_init:
        return _gather_result(args, world, rank, params, stages, sampler)
    client = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.0) if args.optimizer and args.sgd else None
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=client,
        config=cfg,
        model_parameters=model.parameters() if args.optimizer and not args.sgd else None,
    )
    stages["init"] = sampler.stage()
    if args.optimizer:
        for _ in range(args.steps):
            x = torch.randn(1, 3, args.frames, args.size, args.size)
            loss = engine(x).float().square().mean()
            engine.backward(loss)
            engine.step()
        if args.steps:
            stages["step"] = sampler.stage()
        if args.save:  # a ZeRO-3 checkpoint for the export measurement
            from avion_ds.engine import run_checkpoints as ckpt

            if rank == 0:
                Path(args.save).mkdir(parents=True, exist_ok=True)
                (Path(args.save) / "ds_config.json").write_text(json.dumps(cfg))
            ckpt.save(engine, args.save, 1, {"epoch": 0, "step_in_epoch": 1, "global_step": 1}, keep_last=1)
    return _gather_result(args, world, rank, params, stages, sampler)


def run_train_path(args: argparse.Namespace) -> dict[str, Any]:
    """The training command's construction (see the module docstring), measured per stage."""
    import torch.distributed as dist

    from avion_ds.distributed import dist as ds_dist
    from avion_ds.distributed.ds_config import build_ds_config
    from avion_ds.engine.parallelize import parallelize
    from avion_ds.models.partition import param_count
    from avion_ds.tasks import load_recipe, task_of

    world = int(os.environ.get("WORLD_SIZE", "1"))
    recipe = load_recipe(
        None,
        [
            f"model.name={args.model}",
            "data.dataset=kinetics",
            f"data.num_frames={args.frames}",
            f"data.size={args.size}",
            "batch.micro_batch=1",
            f"batch.global_batch={world}",
            f"precision={args.train_path}",
            "schedule.epochs=1",
        ],
    )
    # as the training command: the config is built before the process group exists
    cfg = build_ds_config(Path(__file__).parents[1] / "ds_configs" / "zero3.json", recipe, world, steps_per_epoch=10)
    ds_dist.init()
    rank = dist.get_rank()
    task = task_of(recipe)
    task.build_model(load_recipe(None, ["model.name=vit_test_tiny", "data.dataset=kinetics"]), ds_config=cfg)  # warm-up
    torch.manual_seed(0)
    dist.barrier()
    sampler = RssSampler()
    stages: dict[str, Any] = {}
    model = task.build_model(recipe, ds_config=cfg)
    stages["build"] = sampler.stage()
    params = param_count(model)
    dist.barrier()
    parallel = parallelize(model, recipe, cfg, steps_per_epoch=10)
    stages["init"] = sampler.stage()
    del parallel
    args.mode = f"train-path {args.train_path}"
    return _gather_result(args, world, rank, params, stages, sampler)


def _gather_result(
    args: argparse.Namespace, world: int, rank: int, params: int, stages: dict[str, Any], sampler: RssSampler
) -> dict[str, Any]:
    import torch.distributed as dist

    sampler.close()
    mine = {"rank": rank, "stages": stages}
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    return {
        "model": args.model,
        "mode": args.mode,
        "world_size": world,
        "params": params,
        "fp32_bytes": 4 * params,
        "optimizer": ("sgd" if args.sgd else "adamw") if args.optimizer else None,
        "steps": args.steps if args.optimizer else 0,
        "frames": args.frames,
        "size": args.size,
        "ranks": everyone,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rss", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=("before", "after"), default="after")
    p.add_argument("--pretrained", default=None, help="weights file to load (e.g. written by --write-weights)")
    p.add_argument("--optimizer", action="store_true", help="ZeRO-3 + AdamW and --steps training steps")
    p.add_argument(
        "--sgd",
        action="store_true",
        help="with --optimizer: a client torch.optim.SGD without momentum (no optimizer state) instead of AdamW",
    )
    p.add_argument("--steps", type=int, default=1, help="with --optimizer: training steps before --save (0: none)")
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--save", default=None, help="with --optimizer: save a checkpoint into this run dir")
    p.add_argument("--no-init", action="store_true", help="stop after build (+ load): no deepspeed.initialize")
    p.add_argument("--train-path", choices=("fp32", "bf16"), default=None, help="the training construction")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.no_init and args.optimizer:
        p.error("--no-init and --optimizer exclude each other")
    result = run_train_path(args) if args.train_path else run(args)
    import torch.distributed as dist

    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def write_random_weights(name: str, path: str | Path, **overrides: Any) -> Path:
    """A safetensors file with random weights for ``name``, written tensor by tensor (the model is
    built on the meta device: nothing full is ever in memory)."""
    from avion_ds.models import create_model
    from avion_ds.storage.safetensors_stream import SafetensorsWriter

    with torch.device("meta"):
        model = create_model(name, **overrides)
    sd = model.state_dict()
    writer = SafetensorsWriter(
        path, [(k, torch.float32, tuple(v.shape)) for k, v in sd.items()], {"format": "avion_ds", "model": name}
    )
    g = torch.Generator().manual_seed(0)
    for k, v in sd.items():
        writer.write(k, torch.randn(tuple(v.shape), generator=g) * 0.02)
    return writer.close()


if __name__ == "__main__":
    raise SystemExit(main())


def measure_export(run_dir: str | Path, out: str | Path) -> dict[str, Any]:
    """Peak RSS (total / anon / file-backed) of ``avion-ds export run_dir --out out`` in this process."""
    from avion_ds.engine.export import export

    sampler = RssSampler()
    export(run_dir, out)
    peaks = sampler.stage()
    sampler.close()
    return peaks


def verify_export(
    exported: str | Path, model: str, reference: str | Path | None = None, load_back: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Check an exported safetensors file of ``model``: every state-dict entry present with its shape
    (header only); with ``reference`` (the weights the checkpoint was made from, no step taken) every
    tensor equal to it, read one at a time; with ``load_back`` through ``create_model(model,
    pretrained=exported)`` (the full model in memory), compared with ``reference`` or the file."""
    from avion_ds.models import create_model
    from avion_ds.storage.safetensors_stream import SafetensorsReader

    out_file = SafetensorsReader(exported)
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in create_model(model, **overrides).state_dict().items()}
    got = {k: tuple(e["shape"]) for k, e in out_file.entries.items()}
    result: dict[str, Any] = {
        "tensors": len(got),
        "expected": len(want),
        "missing": sorted(set(want) - set(got)),
        "unexpected": sorted(set(got) - set(want)),
        "wrong_shape": sorted(k for k in set(want) & set(got) if want[k] != got[k]),
    }
    ref = SafetensorsReader(reference) if reference is not None else None
    if ref is not None:
        result["max_abs_diff_vs_reference"] = max(
            float((out_file.get(k) - ref.get(k)).abs().max()) for k in ref.entries
        )
    if load_back:
        loaded = create_model(model, pretrained=str(exported), **overrides).state_dict()
        against = ref or out_file
        result["load_back_max_abs_diff"] = max(float((loaded[k] - against.get(k)).abs().max()) for k in against.entries)
    return result

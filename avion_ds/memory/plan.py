"""`avion-ds plan`: pick ZeRO stage, offload, activation checkpointing and micro-batch for a GPU
budget, and write them as a DeepSpeed config + recipe overrides that `launch/train.py` accepts.

Every combination of ZeRO stage (0-3) x offload (none / optimizer / optimizer+params, CPU or
NVMe) x checkpointing (none, or every 1, 2, 4 blocks with policy ``full`` or ``selective``) x
micro-batch (dividing the per-GPU batch) is estimated with :func:`avion_ds.memory.estimate.estimate`
(its activations exact per policy); what does not fit the GPU (or the host memory, when
``--cpu-mem`` is given) is discarded and the rest is ranked by the cost model of :func:`step_time`
(documented there): at equal memory fit, no checkpointing beats ``selective`` (recomputes part of
a block), which beats ``full`` (recomputes all of it). ``--measure`` (CUDA only) then runs a few real steps of the
top candidates and ranks those by measured clips/s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from avion_ds.config import apply_overrides
from avion_ds.distributed.ds_config import merge_overrides, reference_config
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.memory.estimate import DTYPE_BYTES, MemoryEstimate, arch_info, as_dtype, estimate
from avion_ds.memory.units import format_bytes
from avion_ds.models import list_models, model_flops, registered_arch
from avion_ds.models.activation_checkpointing import selective_recompute_share

CHECKPOINT_CHOICES = (0, 1, 2, 4)  # 0 = none, k = every k-th block
CHECKPOINT_POLICIES = ("full", "selective")  # what a checkpointed block keeps (model.activation_checkpoint_policy)
HW_FIELDS = (
    "gpu_tflops",
    "mfu",
    "saturation_tokens",
    "pcie_gbps",
    "net_gbps",
    "nvme_gbps",
    "cpu_adam_gparams",
    "overlap",
    "stage3_overhead",
)


@dataclass(frozen=True)
class Hardware:
    """Throughput assumptions of the cost model (all overridable on the command line)."""

    gpu_tflops: float = 200.0  # dense 16-bit peak per GPU (H100 ~990, A100 312, RTX 4090/L4 ~165/121)
    mfu: float = 0.45  # fraction of peak a large micro-batch reaches
    saturation_tokens: int = 4096  # tokens per micro-batch at which the GPU is half as efficient
    pcie_gbps: float = 20.0  # host <-> GPU, GB/s per GPU
    net_gbps: float = 50.0  # collective bandwidth per GPU, GB/s (NVLink >> 100, Ethernet ~ 10)
    nvme_gbps: float = 3.0  # per node
    cpu_adam_gparams: float = 2.0  # CPU Adam throughput per node, billion params / s
    overlap: float = 0.5  # fraction of communication / transfer hidden behind compute
    stage3_overhead: float = 0.05  # ZeRO-3 hook / gather-latency cost on compute, even on one GPU


@dataclass
class Candidate:
    zero_stage: int
    offload: str  # none | optimizer | all   (all = optimizer + params)
    offload_device: str  # cpu | nvme (ignored when offload == none)
    checkpoint_every: int  # 0 = no checkpointing
    micro_batch: int
    grad_accum: int
    checkpoint_policy: str = "full"  # full | selective (ignored when checkpoint_every == 0)
    token_merge: int | list[int] = 0  # model.token_merge the candidate is estimated with (0: none)
    patch_dropout: float = 0.0  # model.patch_dropout the candidate is estimated with (0: none)
    peak: int = 0
    host: int = 0
    fits: bool = False
    why: str = ""
    step_s: float = math.inf
    clips_per_s: float = 0.0
    relative_speed: float = 0.0
    measured_clips_per_s: float | None = None
    measured_peak: int | None = None
    estimate: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        off = "none" if self.offload == "none" else f"{self.offload}:{self.offload_device}"
        merge = f" merge={self.token_merge}" if self.token_merge else ""
        merge += f" patch_dropout={self.patch_dropout:g}" if self.patch_dropout else ""
        return (
            f"ZeRO-{self.zero_stage} offload={off} ckpt={self.checkpoint} micro={self.micro_batch} "
            f"accum={self.grad_accum}{merge}"
        )

    @property
    def checkpoint(self) -> str:
        """``none``, ``every k`` (full policy) or ``selective every k``."""
        if not self.checkpoint_every:
            return "none"
        policy = "selective " if self.checkpoint_policy == "selective" else ""
        return f"{policy}every {self.checkpoint_every}"


# ----------------------------------------------------------------------------------------------
# cost model
# ----------------------------------------------------------------------------------------------
def step_time(
    c: Candidate,
    params: int,
    fwd_flops: int,
    depth: int,
    tokens: int,
    world: int,
    gpus_per_node: int,
    dtype_bytes: int,
    hw: Hardware,
    selective_share: float = 1.0,
) -> float:
    """Predicted seconds per optimizer step (global batch) on each GPU.

    compute  = clips_per_gpu * fwd_flops * (3 + r) / (peak * mfu * eff(micro))
               r = checkpointed blocks / depth x the share of a block's forward that backward re-runs
                   (1 for ``full``; ``selective_share`` for ``selective``, from
                   ``models.activation_checkpointing.selective_recompute_share``),
               eff(m) = m*tokens / (m*tokens + saturation_tokens)  (small micro-batches underuse the GPU)
    network  (world > 1, G = params * dtype bytes, ring factor (w-1)/w):
               ZeRO-0/1: 2G per step (all-reduce once per accumulation boundary);
               ZeRO-2: G per micro-step (reduce-scatter) + G per step (all-gather of updated params);
               ZeRO-3: (3 + r) G per micro-step (gather fwd + bwd + recompute, reduce-scatter).
    PCIe     optimizer offload: 6 B/param/GPU per step (fp32 grads down, 16-bit params up) + CPU Adam
               (params * gpus_per_node / world / cpu_adam rate); param offload: (3 + r) * P * s / w per
               micro-step; NVMe adds the same bytes over the node's NVMe bandwidth.
    total    = compute * (1 + stage3_overhead [ZeRO-3]) + (1 - overlap) * (network + PCIe + NVMe) + CPU Adam.
    """
    r = (len(range(0, depth, c.checkpoint_every)) / depth) if c.checkpoint_every else 0.0
    r *= selective_share if c.checkpoint_policy == "selective" else 1.0
    clips = c.micro_batch * c.grad_accum
    eff = (c.micro_batch * tokens) / (c.micro_batch * tokens + hw.saturation_tokens)
    compute = clips * fwd_flops * (3 + r) / (hw.gpu_tflops * 1e12 * hw.mfu * eff)
    if c.zero_stage == 3:
        compute *= 1 + hw.stage3_overhead
    g = params * dtype_bytes
    ring = (world - 1) / world if world > 1 else 0.0
    if c.zero_stage in (0, 1):
        net = 2 * g
    elif c.zero_stage == 2:
        net = g * c.grad_accum + g
    else:
        net = (3 + r) * g * c.grad_accum
    net_s = ring * net / (hw.net_gbps * 1e9)
    pcie = nvme = adam = 0.0
    if c.offload in ("optimizer", "all"):
        part = params / world
        pcie += 6 * part
        adam = params * min(gpus_per_node, world) / world / (hw.cpu_adam_gparams * 1e9)
        if c.offload_device == "nvme":
            nvme += 12 * part * min(gpus_per_node, world) * 2  # read + write fp32 states
    if c.offload == "all":
        moved = (3 + r) * params * dtype_bytes / world * c.grad_accum
        pcie += moved
        if c.offload_device == "nvme":
            nvme += moved * min(gpus_per_node, world)
    transfer = net_s + pcie / (hw.pcie_gbps * 1e9) + nvme / (hw.nvme_gbps * 1e9)
    return compute + (1 - hw.overlap) * transfer + adam


# ----------------------------------------------------------------------------------------------
# enumeration
# ----------------------------------------------------------------------------------------------
def _offload_options(stage: int, nvme: bool) -> list[tuple[str, str]]:
    opts = [("none", "cpu")]
    if stage == 2:
        opts.append(("optimizer", "cpu"))
    if stage == 3:
        opts += [("optimizer", "cpu"), ("all", "cpu")]
        if nvme:
            opts.append(("all", "nvme"))
    return opts


def _checkpoint_options() -> list[tuple[int, str]]:
    """(every, policy): none, then each interval with each policy."""
    return [(0, "full")] + [(k, p) for k in CHECKPOINT_CHOICES if k for p in CHECKPOINT_POLICIES]


def _micro_batches(per_gpu: int | None, max_micro: int) -> list[tuple[int, int]]:
    """(micro, accum) pairs: divisors of the per-GPU batch, or powers of two without a global batch."""
    if per_gpu is None:
        return [(m, 1) for m in (2**i for i in range(12)) if m <= max_micro]
    return [(m, per_gpu // m) for m in range(1, min(per_gpu, max_micro) + 1) if per_gpu % m == 0]


@dataclass
class Request:
    model: str
    frames: int
    size: int
    gpu_mem: int
    gpus: int
    gpus_per_node: int
    cpu_mem: int | None
    global_batch: int | None
    dtype: str
    nvme_path: str | None
    max_micro: int
    hw: Hardware
    # a task's own step memory (``Task.memory_estimator``: e.g. UMT's frozen teacher and visible tokens),
    # called as ``estimator(micro_batch, dtype, zero_stage, **estimate's keywords)``; None: ``estimate`` by name
    estimator: Callable[..., MemoryEstimate] | None = None


@functools.cache
def config_knobs(stage: int, off_opt: bool, off_param: bool, device: str = "cpu") -> dict[str, int]:
    """What the DeepSpeed config a plan writes for this setup (its reference ``ds_configs/*.json``) lets
    ZeRO-3 hold on the GPU, as :func:`estimate` takes it: the prefetch bucket and the live-parameter cap
    (zero3*.json keep up to 1e9 parameters live: the whole of a ViT-g; measured on an H200, ViT-g with
    parameter offload peaked at 2.46 GiB, where the default 1e8 predicted 0.73 GiB and this 2.33 GiB). The
    reduce bucket keeps ``estimate``'s default: the configs' 5e8 has no GPU measurement behind it yet."""
    if stage != 3:
        return {}
    offload = "all" if off_param else "optimizer" if off_opt else "none"
    return live_window(DSPlan.of(reference_config(reference_name(Candidate(stage, offload, device, 0, 1, 1)))))


def live_window(ds: DSPlan) -> dict[str, int]:
    """A DeepSpeed plan's ZeRO-3 prefetch bucket and live-parameter cap, as :func:`estimate` takes them (those
    the config sets)."""
    knobs = {"prefetch_bucket_size": ds.prefetch_bucket_size, "max_live_parameters": ds.max_live_parameters}
    return {k: v for k, v in knobs.items() if v is not None}


def estimate_for(
    req: Request,
    micro: int,
    stage: int,
    off_opt: bool,
    off_param: bool,
    every: int,
    policy: str = "full",
    device: str = "cpu",
) -> MemoryEstimate:
    """One configuration's estimate for ``req``, with the buckets of the config the plan writes: its task's
    estimator, or ``estimate`` of the model by name."""
    knobs = {
        **config_knobs(stage, off_opt, off_param, device),
        "offload_optimizer": off_opt,
        "offload_param": off_param,
        "checkpointing": every,
        "world_size": req.gpus,
        "gpus_per_node": req.gpus_per_node,
        "checkpoint_policy": policy,
    }
    if req.estimator is not None:
        return req.estimator(micro, req.dtype, stage, **knobs)
    return estimate(req.model, req.frames, req.size, micro, req.dtype, stage, **knobs)


def plan(req: Request) -> tuple[list[Candidate], dict[str, Any]]:
    """Estimate every candidate; returns (candidates ranked: fitting by time, then the rest by peak), facts."""

    info = arch_info(req.model, req.frames, req.size)
    flops = model_flops(req.model, num_frames=req.frames, img_size=req.size)
    tokens = (req.frames // info.tubelet_size) * (req.size // info.patch_size) ** 2
    share = selective_recompute_share(info.embed_dim, info.mlp_hidden, tokens)
    s = DTYPE_BYTES[as_dtype(req.dtype)]
    per_gpu = None if req.global_batch is None else req.global_batch // req.gpus
    cands: list[Candidate] = []
    for stage in (0, 1, 2, 3):
        for offload, device in _offload_options(stage, req.nvme_path is not None):
            for every, policy in _checkpoint_options():
                for micro, accum in _micro_batches(per_gpu, req.max_micro):
                    c = Candidate(stage, offload, device, every, micro, accum, policy)
                    e = estimate_for(
                        req, micro, stage, offload in ("optimizer", "all"), offload == "all", every, policy, device
                    )
                    c.peak, c.estimate = e.total, e.as_dict()
                    # NVMe holds the offloaded states: host keeps only pinned buffers (~1/4)
                    c.host = e.host // 4 if (offload != "none" and device == "nvme") else e.host
                    why = []
                    if c.peak > req.gpu_mem:
                        why.append(f"GPU {format_bytes(c.peak)} > {format_bytes(req.gpu_mem)}")
                    if req.cpu_mem is not None and c.host > req.cpu_mem:
                        why.append(f"host {format_bytes(c.host)} > {format_bytes(req.cpu_mem)}")
                    c.fits, c.why = not why, "; ".join(why)
                    c.step_s = step_time(
                        c, info.params, flops, info.depth, tokens, req.gpus, req.gpus_per_node, s, req.hw, share
                    )
                    c.clips_per_s = micro * accum * req.gpus / c.step_s
                    cands.append(c)
    fitting = sorted((c for c in cands if c.fits), key=lambda c: (-c.clips_per_s, c.peak))
    rest = sorted((c for c in cands if not c.fits), key=lambda c: (c.peak, -c.clips_per_s))
    best = fitting[0].clips_per_s if fitting else None
    for c in fitting:
        c.relative_speed = c.clips_per_s / best
    facts = {
        "params": info.params,
        "depth": info.depth,
        "tokens": tokens,
        "fwd_flops": flops,
        "largest_layer": info.largest_layer_params,
        "selective_share": share,
    }
    return fitting + rest, facts


# ----------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------
def reference_name(c: Candidate) -> str:
    """The ``ds_configs/*.json`` a candidate's DeepSpeed config starts from."""
    if c.zero_stage < 2:
        return f"zero{c.zero_stage}"
    if c.zero_stage == 2:
        return "zero2" if c.offload == "none" else "zero2_offload"
    if c.offload == "all":
        return "zero3_nvme" if c.offload_device == "nvme" else "zero3_offload"
    return "zero3"


def plan_overrides(c: Candidate, nvme_path: str | None = None) -> dict[str, Any]:
    """The knobs a plan sets on top of its reference JSON (everything else is the hand-tuned file):
    ZeRO-3 optimizer-only offload adds ``offload_optimizer`` to zero3.json; NVMe offload sets
    ``nvme_path`` in both offload sections of zero3_nvme.json."""
    zo: dict[str, Any] = {}
    if c.zero_stage == 3 and c.offload == "optimizer":
        zo["offload_optimizer"] = {"device": c.offload_device, "pin_memory": True}
    if c.offload == "all" and c.offload_device == "nvme":
        zo["offload_optimizer"] = {"nvme_path": nvme_path}
        zo["offload_param"] = {"nvme_path": nvme_path}
    return {"zero_optimization": zo} if zo else {}


def ds_config_for(c: Candidate, nvme_path: str | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON a plan writes: its reference ``ds_configs/*.json`` with :func:`plan_overrides`
    merged in ("auto" kept where ``build_ds_config`` fills from the recipe at launch)."""

    return merge_overrides(reference_config(reference_name(c)), plan_overrides(c, nvme_path))


def recipe_overrides(c: Candidate, req: Request) -> list[str]:
    """Dotted ``--set`` overrides for the recipe (launch/train.py --set KEY=VALUE); the checkpoint
    policy is always named (``selective`` also names ``checkpoint_impl=torch``, the one it runs on)."""
    sets = [
        f"model.name={req.model}",
        f"data.num_frames={req.frames}",
        f"data.size={req.size}",
        f"batch.micro_batch={c.micro_batch}",
        f"batch.global_batch={req.global_batch if req.global_batch is not None else c.micro_batch * req.gpus}",
        "batch.grad_accum=null",
        f"model.activation_checkpointing={'true' if c.checkpoint_every else 'false'}",
        f"model.activation_checkpoint_every={max(1, c.checkpoint_every)}",
        f"model.activation_checkpoint_policy={c.checkpoint_policy}",
        f"precision={req.dtype}",
    ]
    if c.checkpoint_every and c.checkpoint_policy == "selective":
        sets.insert(-1, "model.activation_checkpoint_impl=torch")
    if c.token_merge:
        sets.insert(-1, f"model.token_merge={c.token_merge}".replace(" ", ""))
    if c.patch_dropout:
        sets.insert(-1, f"model.patch_dropout={c.patch_dropout:g}")
    return sets


def _overrides_yaml(sets: list[str]) -> str:

    return yaml.safe_dump(apply_overrides({}, sets), sort_keys=False)


def format_table(cands: list[Candidate], limit: int) -> str:
    head = (
        f"{'#':>3} {'fits':4} {'zero':4} {'offload':14} {'ckpt':17} {'micro':>5} {'accum':>5} "
        f"{'peak/GPU':>11} {'host/node':>11} {'clips/s':>8} {'rel':>5}"
    )
    lines = [head, "-" * len(head)]
    for i, c in enumerate(cands[:limit], 1):
        off = "none" if c.offload == "none" else f"{c.offload}:{c.offload_device}"
        ck = c.checkpoint
        rel = f"{c.relative_speed:.2f}" if c.fits else "-"
        clips = f"{c.clips_per_s:.1f}" if c.fits else "-"
        lines.append(
            f"{i:>3} {'yes' if c.fits else 'no':4} {c.zero_stage:>4} {off:14} {ck:17} {c.micro_batch:>5} "
            f"{c.grad_accum:>5} {format_bytes(c.peak):>11} {format_bytes(c.host):>11} {clips:>8} {rel:>5}"
        )
        if c.measured_clips_per_s is not None:
            lines[-1] += f"   measured {c.measured_clips_per_s:.1f} clips/s, peak {format_bytes(c.measured_peak or 0)}"
    return "\n".join(lines)


# memory-lean configurations tried when looking for the closest request that fits
_LEAN = ((3, True, True), (3, True, False), (2, True, False), (2, False, False), (0, False, False))


def explain_impossible(req: Request, cands: list[Candidate]) -> str:
    """Why nothing fits, and what comes closest: the binding limit (GPU or host) with the smallest
    configuration's breakdown, shorter clips or a smaller registered model that fit, or the memory needed."""

    low = min(cands, key=lambda c: c.peak)
    e = low.estimate
    parts = ", ".join(
        f"{k} {format_bytes(e[k])}" for k in ("params", "activations", "recompute", "workspace", "context")
    )
    gpu_ok = [c for c in cands if c.peak <= req.gpu_mem]
    if gpu_ok:  # the GPU is big enough for some configuration: host memory is what fails
        lean = min(gpu_ok, key=lambda c: c.host)
        msg = [
            (
                f"nothing fits: {req.model} {req.frames}x{req.size} fits {format_bytes(req.gpu_mem)} per GPU, but every "
                f"such configuration needs at least {format_bytes(lean.host)} host memory per node ({lean.label}) "
                f"and --cpu-mem is {format_bytes(req.cpu_mem or 0)}"
            )
        ]
    else:
        msg = [
            (
                f"nothing fits: {req.model} {req.frames}x{req.size} needs at least {format_bytes(low.peak)} per GPU "
                f"({low.label}: {parts}) but --gpu-mem is {format_bytes(req.gpu_mem)}"
            )
        ]

    def _fits(model: str, frames: int) -> bool:
        for stage, off_opt, off_param in _LEAN:
            if req.estimator is not None and (model, frames) == (req.model, req.frames):
                est = estimate_for(req, 1, stage, off_opt, off_param, 1)
            else:
                est = estimate(
                    model,
                    frames,
                    req.size,
                    1,
                    req.dtype,
                    stage,
                    off_opt,
                    off_param,
                    1,
                    req.gpus,
                    gpus_per_node=req.gpus_per_node,
                    **config_knobs(stage, off_opt, off_param),
                )
            if est.total <= req.gpu_mem and (req.cpu_mem is None or est.host <= req.cpu_mem):
                return True
        return False

    tub = registered_arch(req.model).tubelet_size
    frames = [f for f in range(req.frames - tub, 0, -tub) if _fits(req.model, f)]
    if frames:
        msg.append(f"closest: {req.model} fits with --frames {frames[0]} (micro-batch 1, checkpoint every block)")
    kind = type(registered_arch(req.model))  # classifiers for a classifier, dual encoders for a dual encoder
    smaller = [
        m
        for m in list_models()
        if m.startswith(("vit_", "clip_"))
        and "_test_" not in m
        and m != req.model
        and type(registered_arch(m)) is kind
        and req.size % registered_arch(m).patch_size == 0
        and req.frames % registered_arch(m).tubelet_size == 0
        and _fits(m, req.frames)
    ]

    def width_depth(m: str) -> int:
        a = registered_arch(m).video_transformer
        return a.embed_dim * a.depth

    if smaller:
        biggest = max(smaller, key=width_depth)
        msg.append(f"closest: {biggest} fits at {req.frames}x{req.size}")
    need = [f"--gpu-mem {math.ceil(low.peak / 2**30)}GiB"] if not gpu_ok else []
    if req.cpu_mem is not None and (gpu_ok or low.host > req.cpu_mem):
        host = min(gpu_ok, key=lambda c: c.host).host if gpu_ok else low.host
        need.append(f"--cpu-mem {math.ceil(host / 2**30)}GiB")
    msg.append("or give at least " + " and ".join(need))
    return "\n".join(msg)

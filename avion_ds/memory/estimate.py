"""Per-GPU peak memory of a training step, broken into parameters, gradients, optimizer states,
activations and workspace, plus the host (CPU) memory that offloading needs.

Model states follow DeepSpeed: for 16-bit mixed precision (bf16/fp16 + Adam) under ZeRO-2/3 the
totals come from DeepSpeed's own estimators (``estimate_zero2_model_states_mem_needs``,
``estimate_zero3_model_states_mem_needs``), split into parts with the byte counts their code
comments give (2 B 16-bit params; 2 B 16-bit grads + 4 B fp32 grads; 4 B fp32 master + 8 B Adam
moments). ZeRO-0/1 and fp32 use the same per-parameter byte counts with the partitioning of the
stage. Activations use :func:`activation_bytes_per_clip`, an analytic formula calibrated against
the exact saved-tensor count of :func:`avion_ds.memory.activations.measure_activation_bytes`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from avion_ds.distributed.ds_fields import PRECISIONS, torch_dtype
from avion_ds.memory.merging import merging_block_bytes, merging_blocks_bytes, tokens_per_block
from avion_ds.memory.units import format_bytes
from avion_ds.models import create_model, registered_arch
from avion_ds.models.clip.model import ClipArch
from avion_ds.models.meta import meta_device
from avion_ds.models.partition import full_shape

GiB = 2**30
CUDA_CONTEXT_BYTES = 512 * 2**20  # CUDA context + cuBLAS/cuDNN handles (not seen by the allocator)
COMM_BUFFER_BYTES = 256 * 2**20  # NCCL buffers when world_size > 1
FRAGMENTATION = 0.08  # caching-allocator slack, fraction of the allocated peak
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
_DTYPE_NAMES = {
    name: torch_dtype(p)
    for p in PRECISIONS  # fp32 | float32, bf16 | bfloat16, fp16 | float16
    for name in (p, str(torch_dtype(p)).removeprefix("torch."))
}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.bfloat16`` / ``"bf16"`` / ``"fp16"`` / ``"fp32"`` -> torch dtype (ValueError naming it)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype={dtype} is not one of float32, bfloat16, float16")
        return dtype
    if str(dtype).lower() not in _DTYPE_NAMES:
        raise ValueError(f"dtype={dtype!r} is not one of fp32, bf16, fp16")
    return _DTYPE_NAMES[str(dtype).lower()]


# ----------------------------------------------------------------------------------------------
# architecture facts
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArchInfo:
    """What the estimator needs to know about a model (no weights)."""

    name: str
    embed_dim: int
    depth: int
    num_heads: int
    mlp_hidden: int
    patch_size: int
    tubelet_size: int
    in_chans: int
    pool: str
    layer_scale: bool
    attn_backend: str
    params: int
    largest_layer_params: int  # largest single module's own parameters (what ZeRO-3 gathers at once)
    # CLIP layout (video tower of a dual encoder): ln_pre, class token, projection, patch dropout
    layout: str = "videomae"  # videomae | clip
    proj_dim: int = 0
    patch_dropout: float = 0.0
    drop_path_rate: float = 0.0
    drop_path_schedule: str = "linear"  # linear: rate 0 in block 0; uniform: every block drops
    text: TextInfo | None = None  # the text tower of a dual encoder
    token_merge: tuple[int, ...] = ()  # tokens merged after each block (memory/merging.py); () = none
    # run-length tokenization: its token count depends on the clip, so the estimate is the worst case (no patch
    # dropped: the dense count) plus its own small saves (keep mask, run lengths, packed layout)
    rlt: bool = False


@dataclass(frozen=True)
class TextInfo:
    """The text tower of a dual encoder: ``context`` tokens per caption, one caption per clip."""

    embed_dim: int
    depth: int
    num_heads: int
    mlp_hidden: int
    context: int
    proj_dim: int
    attn_backend: str
    layer_scale: bool = False


def _count(model: nn.Module) -> tuple[int, int]:
    total = sum(math.prod(full_shape(p)) for p in model.parameters())
    largest = max(
        (sum(math.prod(full_shape(p)) for p in m.parameters(recurse=False)) for m in model.modules()), default=0
    )
    return int(total), int(largest)


@functools.lru_cache(maxsize=64)
def _arch_info_by_name(name: str) -> ArchInfo:
    with meta_device():  # nothing is allocated, even for ViT-g
        model = create_model(name)
    return arch_info(model)


def arch_info(model: nn.Module | str, frames: int | None = None, size: int | None = None) -> ArchInfo:
    """ArchInfo of a VideoViT instance or of a registered name (built once on the meta device;
    other frames/size only change a learned position embedding's parameter count)."""
    if isinstance(model, str):
        base = _arch_info_by_name(model)
        arch = registered_arch(model)
        arch = arch.video_transformer  # dual encoder: frames / size are the video tower's
        new = arch.replace(num_frames=frames or arch.num_frames, img_size=size or arch.img_size)  # validates
        if arch.pos_embed == "learned":
            delta = (new.num_patches - arch.num_patches) * arch.embed_dim
            return dataclasses.replace(
                base,
                params=base.params + delta,
                largest_layer_params=max(base.largest_layer_params, new.num_patches * arch.embed_dim),
            )
        if arch.pos_embed == "clip":  # the temporal table: one row per frame, none for one frame
            rows = [a.grid[0] if a.grid[0] > 1 else 0 for a in (arch, new)]
            return dataclasses.replace(base, params=base.params + (rows[1] - rows[0]) * arch.embed_dim)
        return base
    if isinstance(getattr(model, "arch", None), ClipArch):  # the architecture says: video-text dual encoder
        t = model.arch.text
        text = TextInfo(
            t.embed_dim, t.depth, t.num_heads, t.mlp_hidden, t.context_length, t.proj_dim or 0, t.attn_backend
        )
        total, largest = _count(model)
        video = arch_info(model.visual)
        return dataclasses.replace(video, params=total, largest_layer_params=largest, text=text)
    arch = getattr(model, "arch", None)
    total, largest = _count(model)
    return ArchInfo(
        name=getattr(arch, "name", type(model).__name__),
        embed_dim=int(model.embed_dim),
        depth=int(model.depth),
        num_heads=int(model.num_heads),
        mlp_hidden=int(getattr(arch, "mlp_hidden", 4 * model.embed_dim)),
        patch_size=int(model.patch_size),
        tubelet_size=int(model.tubelet_size),
        in_chans=int(getattr(model, "in_chans", 3)),
        pool=str(getattr(arch, "pool", "mean")),
        layer_scale=bool(getattr(arch, "layer_scale", None)),
        attn_backend=str(getattr(arch, "attn_backend", "auto")),
        params=total,
        largest_layer_params=largest,
        layout="clip" if getattr(arch, "pos_embed", None) == "clip" else "videomae",
        proj_dim=int(getattr(arch, "proj_dim", None) or 0),
        patch_dropout=float(getattr(arch, "patch_dropout", 0.0)),
        drop_path_rate=float(getattr(arch, "drop_path_rate", 0.0)),
        drop_path_schedule=str(getattr(arch, "drop_path_schedule", "linear")),
        token_merge=tuple(arch.merge_schedule) if getattr(arch, "merges", False) else (),
        rlt=bool(getattr(arch, "rlt", False)),
    )


# ----------------------------------------------------------------------------------------------
# activations
# ----------------------------------------------------------------------------------------------
def count_checkpointed_blocks(depth: int, checkpointing: bool | int, first_n: int | None = None) -> int:
    """How many blocks ``apply_activation_checkpointing(every=k, first_n)`` wraps: blocks i with
    i % k == 0 among the first ``first_n`` (all when None). ``checkpointing`` False/0 = none, True = 1."""
    if not checkpointing:
        return 0
    every = 1 if checkpointing is True else int(checkpointing)
    if every <= 0:
        raise ValueError(f"checkpointing={checkpointing!r}: every must be positive")
    n = depth if first_n is None else max(0, min(depth, int(first_n)))
    return len(range(0, n, every))


def selected_blocks(depth: int, checkpointing: bool | int, first_n: int | None = None) -> set[int]:
    """The block indices ``count_checkpointed_blocks`` counts."""
    if not checkpointing:
        return set()
    every = 1 if checkpointing is True else int(checkpointing)
    n = depth if first_n is None else max(0, min(depth, int(first_n)))
    return set(range(0, n, every))


def block_activation_bytes(info: ArchInfo | TextInfo, tokens: int, dtype_bytes: int, attn_backend: str = "sdpa") -> int:
    """Saved bytes of ONE un-checkpointed block for one clip (see activation_bytes_per_clip)."""
    n, d, f, h, s = tokens, info.embed_dim, info.mlp_hidden, info.num_heads, dtype_bytes
    per_token = s * (8 * d + f + 4) + (2 * d * s if info.layer_scale else 0)
    if attn_backend == "eager":
        probs = h * n * n * (4 + (s if s != 4 else 0))  # fp32 softmax output (+ its cast copy)
        return n * per_token + n * d * s + probs
    return n * per_token + 4 * h * n  # + fp32 log-sum-exp of the fused kernel


def checkpointed_block_bytes(
    info: ArchInfo | TextInfo, tokens: int, dtype_bytes: int, attn_backend: str = "sdpa", policy: str = "full"
) -> int:
    """Saved bytes of ONE checkpointed block for one clip: ``full`` keeps its input (N D s);
    ``selective`` (models/activation_checkpointing.py) also keeps the q/k/v projection (3 N D s) and
    the attention output (N D s) with the fused kernel's fp32 log-sum-exp (4 H N), or with eager
    attention both batched matmuls' outputs (H N^2 s + N D s)."""
    n, d, s = tokens, info.embed_dim, dtype_bytes
    if policy == "full":
        return n * d * s
    if policy != "selective":
        raise ValueError(f"checkpoint policy={policy!r}: expected full or selective")
    attn = info.num_heads * n * n * s if attn_backend == "eager" else 4 * info.num_heads * n
    return 5 * n * d * s + attn


def activation_bytes_per_clip(
    info: ArchInfo,
    frames: int,
    size: int,
    dtype: torch.dtype | str = torch.bfloat16,
    checkpointing: bool | int = False,
    first_n: int | None = None,
    attn_backend: str | None = None,
    policy: str = "full",
) -> int:
    """Bytes autograd keeps after the forward of one clip (what item-1 measurement counts).

    With N tokens (+1 for a class token), width D, MLP hidden F, H heads, depth L, element size s
    (2 for bf16/fp16, 4 for fp32) and c of the L blocks checkpointed:

        block  = N * (s * (8 D + F + 4) + 4 H)      fused attention (flash / sdpa)
                 [+ 2 N D s with LayerScale]
                 eager attention instead of 4 N H: + N D s + H N^2 (4 + s [s != 4])
        where 8 D = LN1 in + qkv in + q,k,v (3) + attention out (= proj in) + LN2 in + fc1 in,
              F = GELU in (its output, fc2's input, is recomputed: models/mlp.py), 4 = LayerNorm mean/rstd (2 norms), 4 H = fp32 log-sum-exp.
        total  = (L - c) * block + c * ckpt             (ckpt: ``checkpointed_block_bytes``; N D s, its
                                                         input, for the ``full`` policy)
                 + 3 T H W s                            (tubelet-embedding input patches)
                 + tail                                 (pool: mean -> 2 D s + 2 s; cls -> (N+1) D s + 2 s)

    A model that merges tokens (``info.token_merge``) counts its blocks per block instead, each on its
    own token count, with the merges' saves (``memory/merging.py``); the pooling sees the last count.
    Run-length tokenization (``info.rlt``) keeps a number of tokens that depends on the clip: counted at
    the worst case, no patch dropped, plus 17 bytes a token for its keep mask, run lengths and packed layout,
    N D s per un-checkpointed block (the clips' attention outputs, concatenated on CPU, are kept apart from
    the projection's input; a view on the GPU paths, so there this is an upper bound) and, with mean
    pooling, N D 4 + 8 (the per-clip mean's float32 source and token count).
    Activations do not depend on ZeRO stage or offload. Scales linearly with micro-batch.
    """
    s = DTYPE_BYTES[as_dtype(dtype)]
    backend = attn_backend or info.attn_backend
    backend = "eager" if backend == "eager" else "sdpa"
    if frames % info.tubelet_size:
        raise ValueError(f"frames={frames} is not divisible by the tubelet size {info.tubelet_size}")
    if size % info.patch_size:
        raise ValueError(f"size={size} is not divisible by the patch size {info.patch_size}")
    patches = (frames // info.tubelet_size) * (size // info.patch_size) ** 2
    if info.patch_dropout > 0:  # training keeps this many patch tokens (models/vit/model.py drop_patches)
        patches = max(1, int(patches * (1 - info.patch_dropout)))
    tokens = patches + (1 if info.pool == "cls" else 0)
    c = count_checkpointed_blocks(info.depth, checkpointing, first_n)
    d = info.embed_dim
    if info.token_merge:  # per-block token counts, the merges' own saves and the size-weighted pooling
        ckpts = selected_blocks(info.depth, checkpointing, first_n)
        ckpt = functools.partial(checkpointed_block_bytes, info, dtype_bytes=s, attn_backend=backend, policy=policy)
        blocks = merging_blocks_bytes(info, tokens, s, backend, ckpts, ckpt, policy == "selective")
        last = tokens_per_block(tokens, list(info.token_merge))[-1]  # what the pooling sees
    else:
        block = block_activation_bytes(info, tokens, s, backend)
        blocks = (info.depth - c) * block + c * checkpointed_block_bytes(info, tokens, s, backend, policy)
        last = tokens
    body = blocks + info.in_chans * frames * size * size * s
    if info.rlt:  # worst case, every patch kept (models/vit/model.py _rlt_features)
        body += 17 * tokens  # the keep mask (bool), run lengths and each token's clip (int64)
        body += (info.depth - c) * tokens * d * s  # packed attention's output apart from the projection's input
        body += tokens * d * 4 + 8 if info.pool == "mean" else 0  # the per-clip mean's float32 source, count
    if info.layout != "clip":
        tail = (last * d * s + d * s + 2 * s) if info.pool == "cls" else (2 * d * s + 2 * s)
        return body + tail
    extra = tokens * d * s + 2 * tokens * s  # ln_pre: its input and statistics
    extra += last * d * s + 2 * s  # the class-token norm (ln_post): the last block's output, its statistics
    extra += d * s if info.proj_dim else 0  # the projection's input
    extra += 8 * (patches + 1) if info.patch_dropout > 0 else 0  # patch dropout's int64 indices (kept, row)
    if info.drop_path_rate > 0:  # stochastic depth: a mask per branch of un-checkpointed blocks that drop
        first = 0 if info.drop_path_schedule == "uniform" else 1  # the linear ramp's block 0 has rate 0
        kept = set(range(first, info.depth)) - selected_blocks(info.depth, checkpointing, first_n)
        extra += 2 * s * len(kept)
    if info.text is not None:
        extra += text_activation_bytes(info.text, s, checkpointing, first_n, backend, policy)
    return body + extra


def text_activation_bytes(
    text: TextInfo,
    s: int,
    checkpointing: bool | int = False,
    first_n: int | None = None,
    backend: str = "sdpa",
    policy: str = "full",
) -> int:
    """Saved bytes of a dual encoder's text tower for one caption, plus the dual encoder's own forward.

    Blocks as the video tower's on ``context`` tokens (the causal kernels save the same), the token
    ids (int64) the embedding keeps, the two int64 indices that pick the end-of-text token, its
    norm's input and statistics, the projection's input; then the forward's L2 normalisation of
    both embeddings in float32 (each: the embedding, its norm, the clamped norm) and the fp32 logit scale
    (4 bytes once per batch, counted in every clip's share).
    """
    n, d = text.context, text.embed_dim
    c = count_checkpointed_blocks(text.depth, checkpointing, first_n)
    blocks = (text.depth - c) * block_activation_bytes(text, n, s, backend)
    blocks += c * checkpointed_block_bytes(text, n, s, backend, policy)
    pooled = 8 * n + 2 * 8 + d * s + 2 * s + (d * s if text.proj_dim else 0)
    e = text.proj_dim or d
    f = max(s, 4)  # 16-bit embeddings are normalised in float32 (models/clip/model.py)
    return blocks + pooled + 2 * (e * f + 2 * f) + 4  # exp of the fp32 temperature (clamped after the step)


# ----------------------------------------------------------------------------------------------
# full estimate
# ----------------------------------------------------------------------------------------------
@dataclass
class MemoryEstimate:
    """Per-GPU bytes of one training step's peak, and host bytes per node."""

    params: int
    grads: int
    optimizer: int
    activations: int  # saved for backward (micro_batch clips)
    recompute: int  # one checkpointed block re-materialised during backward
    workspace: int  # backward temporaries + ZeRO buckets / prefetch
    fragmentation: int
    context: int  # CUDA context and communication buffers (outside the allocator)
    allocated_peak: int  # what torch.cuda.max_memory_allocated should report
    total: int  # device memory needed: allocated_peak + fragmentation + context
    host: int  # CPU memory per node (offloaded states, pinned buffers, model construction)
    model_states_source: str
    inputs: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        parts = ("params", "grads", "optimizer", "activations", "recompute", "workspace", "fragmentation", "context")
        body = ", ".join(f"{p} {format_bytes(getattr(self, p))}" for p in parts)
        return f"total {format_bytes(self.total)} per GPU ({body}); host {format_bytes(self.host)} per node"


ZERO3_FP32_EXTRA_BYTES = 5  # per parameter / world, measured beyond 16 B (fp32 ZeRO-3 + Adam)


def _model_states(
    p: int,
    largest: int,
    s: int,
    stage: int,
    off_opt: bool,
    off_param: bool,
    world: int,
    per_node: int,
    nodes: int,
    live_window: int,
) -> tuple[int, int, int, int, str]:
    """(params, grads, optimizer) bytes per GPU, host bytes per node, and the numbers' source.

    ZeRO-3 keeps gathered parameters for the modules being computed: DeepSpeed's estimator counts
    4 x the largest layer; we take the larger of that and ``live_window`` 16-bit parameters
    (stage3_max_live_parameters + stage3_prefetch_bucket_size, capped at the model size).
    """
    w = world
    live = max(4 * largest, min(p, live_window) * s) if stage == 3 else 0
    if s == 4:  # fp32 Adam: 4 B params, 4 B grads, 8 B moments; no separate master copy
        params = (0 if off_param else 4 * p // w) + live if stage == 3 else 4 * p
        grads = 0 if (off_opt and stage >= 2) else 4 * p // (w if stage >= 2 else 1)
        opt = 0 if off_opt else 8 * p // (w if stage >= 1 else 1)
        if stage == 3 and not off_opt:
            # Measured (BENCHMARKS.md "ZeRO-3 + Adam per rank", ViT-B/L, 2 CPU ranks): after a step
            # each rank holds ~21 B x p / world plus the contiguous-gradient bucket (counted in
            # ``workspace``), not 16 B: +5 B/param/world that the stage-3 optimizer keeps beyond
            # params, grads and moments.
            grads += ZERO3_FP32_EXTRA_BYTES * p // w
        host = int(p * 16 * 1.5 / nodes) if (off_opt or off_param) else int(p * 4 * per_node * 1.5)
        return params, grads, opt, host, "formula (fp32 Adam)"
    if stage in (2, 3):
        from deepspeed.runtime.zero.stage3 import (  # lazy: deepspeed takes seconds to import
            estimate_zero3_model_states_mem_needs,
        )
        from deepspeed.runtime.zero.stage_1_and_2 import (  # lazy: deepspeed takes seconds to import
            estimate_zero2_model_states_mem_needs,
        )

        if stage == 2:
            host, gpu = estimate_zero2_model_states_mem_needs(p, per_node, nodes, cpu_offload=off_opt)
            params = 2 * p
        else:
            host, gpu, ds_live = estimate_zero3_model_states_mem_needs(
                p, largest, per_node, nodes, cpu_offload=off_opt or off_param, cpu_offload_params=off_param
            )
            gpu += live - ds_live
            params = live + (0 if off_param else 2 * p // w)
        grads, opt = (0, 0) if (off_opt or off_param) else (6 * p // w, 12 * p // w)
        rest = gpu - params - grads - opt  # DeepSpeed's integer rounding: keep its total exactly
        return params, grads + rest, opt, int(host), f"deepspeed estimate_zero{stage}_model_states_mem_needs"
    # ZeRO-0 / ZeRO-1 with 16-bit mixed precision: the same per-parameter bytes, less partitioning
    params = 2 * p
    if stage == 0:
        grads, opt = 6 * p, 12 * p
    else:
        grads = 2 * p + (0 if off_opt else 4 * p // w)
        opt = 0 if off_opt else 12 * p // w
    host = int(p * max(4 * per_node, 16) * 1.5) if off_opt else int(p * 4 * per_node * 1.5)
    return params, grads, opt, host, "formula (16-bit Adam)"


def _check_setup(zero_stage: int, offload_optimizer: bool, offload_param: bool, micro_batch: int, world: int) -> None:
    """ValueError for a ZeRO stage / offload / batch combination DeepSpeed would refuse."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage} is not one of 0, 1, 2, 3")
    if offload_param and zero_stage != 3:
        raise ValueError(f"offload_param needs zero_stage=3, got zero_stage={zero_stage}")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer needs zero_stage >= 1, got zero_stage=0")
    if micro_batch <= 0 or world <= 0:
        raise ValueError(f"micro_batch={micro_batch} and world_size={world} must be positive")


def _bucket_bytes(zero_stage: int, reduce_bucket_size: int, params: int, elem_bytes: int) -> int:
    """Gradient reduce buckets: two in flight under ZeRO-1/2, one under ZeRO-3 (its prefetch is inside
    the live-parameter window counted with the parameters), none under ZeRO-0."""
    if zero_stage in (1, 2):
        return 2 * min(reduce_bucket_size, params) * elem_bytes
    if zero_stage == 3:
        return min(reduce_bucket_size, params) * elem_bytes
    return 0


def _info_of(model: nn.Module | str | ArchInfo, frames: int, size: int) -> ArchInfo:
    """``model``'s ArchInfo: as given (e.g. a registered model's, with the planner's token merging), by name
    at ``frames`` x ``size``, or of a model instance."""
    if isinstance(model, ArchInfo):
        return model
    return arch_info(model, frames, size) if isinstance(model, str) else arch_info(model)


def _recomputed_block(info: ArchInfo, tokens: int, s: int, backend: str) -> int:
    """What one block re-materialises in backward for one clip: the first block (the most tokens; with
    token merging, its merge's saves too)."""
    if info.token_merge:
        return merging_block_bytes(info, tokens, info.token_merge[0], s, backend)
    return block_activation_bytes(info, tokens, s, backend)


def estimate(
    model: nn.Module | str | ArchInfo,
    frames: int,
    size: int,
    micro_batch: int,
    dtype: torch.dtype | str = torch.bfloat16,
    zero_stage: int = 0,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    checkpointing: bool | int = False,
    world_size: int = 1,
    *,
    gpus_per_node: int | None = None,
    first_n: int | None = None,
    attn_backend: str | None = None,
    reduce_bucket_size: int = 50_000_000,
    prefetch_bucket_size: int = 50_000_000,
    max_live_parameters: int = 100_000_000,
    checkpoint_policy: str = "full",
) -> MemoryEstimate:
    """Predict the per-GPU peak of one training step (forward + backward + optimizer step).

    ``model``: a VideoViT, a registered name or an ``ArchInfo`` (the tokens it merges included). ``checkpointing``: False, True or every-k;
    ``checkpoint_policy``: what a checkpointed block keeps (``full`` | ``selective``).
    ``offload_param`` needs ZeRO-3; ``offload_optimizer`` ZeRO >= 1. Bucket sizes are elements
    (what the planner writes into the DeepSpeed config).
    """
    _check_setup(zero_stage, offload_optimizer, offload_param, micro_batch, world_size)
    dt = as_dtype(dtype)
    s = DTYPE_BYTES[dt]
    info = _info_of(model, frames, size)
    per_node = gpus_per_node or min(world_size, 8)
    nodes = max(1, math.ceil(world_size / per_node))
    params, grads, opt, host, source = _model_states(
        info.params,
        info.largest_layer_params,
        s,
        zero_stage,
        offload_optimizer,
        offload_param,
        world_size,
        per_node,
        nodes,
        max_live_parameters + prefetch_bucket_size,
    )
    backend = "eager" if (attn_backend or info.attn_backend) == "eager" else "sdpa"
    act = micro_batch * activation_bytes_per_clip(
        info, frames, size, dt, checkpointing, first_n, backend, checkpoint_policy
    )
    tokens = (frames // info.tubelet_size) * (size // info.patch_size) ** 2
    recompute = micro_batch * _recomputed_block(info, tokens, s, backend) if checkpointing else 0
    # backward temporaries: gradients of the widest intermediates of the block being differentiated
    temps = micro_batch * tokens * s * (2 * info.mlp_hidden + 4 * info.embed_dim)
    workspace = temps + _bucket_bytes(zero_stage, reduce_bucket_size, info.params, s)
    allocated = params + grads + opt + act + recompute + workspace
    frag = int(FRAGMENTATION * allocated)
    context = CUDA_CONTEXT_BYTES + (COMM_BUFFER_BYTES if world_size > 1 else 0)
    inputs = {"model": info.name, "frames": frames, "size": size, "micro_batch": micro_batch}
    inputs.update(dtype=str(dt).replace("torch.", ""), zero_stage=zero_stage, offload_optimizer=offload_optimizer)
    inputs.update(offload_param=offload_param, checkpointing=int(checkpointing))
    inputs.update(checkpoint_policy=checkpoint_policy if checkpointing else "none")
    inputs.update(world_size=world_size, params_count=info.params)
    return MemoryEstimate(
        params=int(params),
        grads=int(grads),
        optimizer=int(opt),
        activations=int(act),
        recompute=int(recompute),
        workspace=int(workspace),
        fragmentation=frag,
        context=context,
        allocated_peak=int(allocated),
        total=int(allocated + frag + context),
        host=int(host),
        model_states_source=source,
        inputs=inputs,
    )

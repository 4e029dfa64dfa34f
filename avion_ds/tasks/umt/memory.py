"""What a UMT step holds, for the memory planner (``avion-ds plan --config`` of a ``task: umt`` recipe).

The student is counted as the planner counts any video ViT (its parameters, gradients and optimizer states
by ZeRO stage and offload), with its saved activations on the VISIBLE tokens only; the teacher by the
holding rule of :mod:`~avion_ds.tasks.umt.teacher`: a float32 replica on every rank, whatever the ZeRO
stage (frozen, read every step, no gradients: partitioning it would add a gather per block for nothing to
update), no optimizer state, nothing saved for backward (``no_grad``). What its forward leaves alive while
the student runs (the features of every token and the class attention) is counted beside the student's
activations; the forward's own transient peak (one block's working set on every frame of the batch, before
the student starts) is taken when it is higher than the student's.

Per clip, with T frames, N = T*h*w student tokens of which n are visible, K returned layers, the
teacher's width C after projection, D the student's width, s its element size:

    student  = video ViT blocks on n tokens (``block_activation_bytes`` / ``checkpointed_block_bytes``)
               + n P s (the visible tubelets, P = 3 * tubelet * patch^2, the linear embedding's input)
               + 2 s per dropping block branch (DropPath's mask)
               + K n (2 D s + 2 s)                 (fc_norm of the stacked returned blocks, decoders' input)
               + K n (C s + 2 s)                   (each decoder's LayerNorm)
               + K n (4 C + 8)                     (the float32 l2 normalisation)
               + K n C 4                           (the teacher's targets at the visible positions)
    held     = K N C 4 + T h w 4                   (the teacher's features and class attention, float32)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

from avion_ds.memory.estimate import (
    DTYPE_BYTES,
    FRAGMENTATION,
    MemoryEstimate,
    arch_info,
    as_dtype,
    block_activation_bytes,
    checkpointed_block_bytes,
    count_checkpointed_blocks,
    estimate,
    selected_blocks,
)
from avion_ds.models.arch import drop_path_rates
from avion_ds.models.meta import meta_device
from avion_ds.tasks.umt.teacher import tower_arch

if TYPE_CHECKING:
    from avion_ds.config import Recipe


def visible_tokens(grid: tuple[int, int, int], kind: str, ratio: float) -> int:
    """Visible tokens per clip: ``attention`` and ``tube`` hide ``int(h w ratio)`` per frame, ``random``
    ``int(N ratio)`` of all (``masking``, ``avion_ds.data.masking``)."""
    t, h, w = grid
    if kind == "random":
        return t * h * w - int(t * h * w * ratio)
    return t * (h * w - int(h * w * ratio))


def student_activation_bytes(
    student: Any,
    visible: int,
    out_dim: int,
    dtype: Any,
    checkpointing: bool | int = False,
    policy: str = "full",
    first_n: int | None = None,
) -> int:
    """Bytes the UMT student's forward and loss save for backward, one clip (module doc); checkpointing as
    ``apply_activation_checkpointing(every=checkpointing, first_n, policy)`` wraps its blocks."""
    info = arch_info(student)
    s = DTYPE_BYTES[as_dtype(dtype)]
    backend = "eager" if info.attn_backend == "eager" else "sdpa"
    n, d, c, k = visible, info.embed_dim, out_dim, len(student.clip_decoder)
    ckpt = count_checkpointed_blocks(info.depth, checkpointing, first_n)
    body = (info.depth - ckpt) * block_activation_bytes(info, n, s, backend)
    body += ckpt * checkpointed_block_bytes(info, n, s, backend, policy)
    body += n * info.in_chans * info.tubelet_size * info.patch_size**2 * s
    rates = drop_path_rates(info.drop_path_rate, info.depth, info.drop_path_schedule)
    wrapped = selected_blocks(info.depth, checkpointing, first_n)
    body += 2 * s * sum(1 for i, r in enumerate(rates) if r > 0 and i not in wrapped)
    head = k * n * (2 * d * s + 2 * s) + k * n * (c * s + 2 * s) + k * n * (4 * c + 8) + k * n * c * 4
    return body + head


def teacher_held_bytes(teacher_layers: int, out_dim: int, grid: tuple[int, int, int]) -> int:
    """The teacher's outputs alive during the student's forward, one clip (float32)."""
    t, h, w = grid
    return teacher_layers * t * h * w * out_dim * 4 + t * h * w * 4


def teacher_forward_peak(
    tower_info: Any, frames: int, size: int, resolution: int, layers: int, out_dim: int, act_bytes: int
) -> int:
    """The teacher forward's peak bytes for one clip (``no_grad``: nothing saved), counted as
    ``ClipTeacher.forward`` allocates them: the clip itself (float32), the returned features written layer
    by layer into one float32 buffer, the last block's class attention (B*T, 1+HW) float32, and that last
    block's MLP at its widest (fc2's output): the block's input and its post-attention residual (float32:
    ``ln_pre`` and the norms run in float32 under autocast, so the residual stream is float32), the norm's
    output (float32), fc1's and GELU's outputs and fc2's, at ``act_bytes`` (autocast's element size; 4 where
    the step runs without autocast, on CPU). Per clip: under autocast the step adds fc2's weight cast once
    (:func:`umt_estimate`).
    Exact on CPU (``tests/memory/test_umt_memory.py``); on a GPU, BENCHMARKS.md's UMT section."""
    hw = (resolution // tower_info.patch_size) ** 2
    n, d, f = hw + 1, tower_info.embed_dim, tower_info.mlp_hidden
    clip = 3 * frames * size * size * 4
    feats = layers * frames * hw * out_dim * 4
    class_attention = frames * n * 4
    mlp = frames * n * (3 * 4 * d + 2 * act_bytes * f + act_bytes * d)
    return clip + feats + class_attention + mlp


@dataclasses.dataclass(frozen=True)
class UMTModels:
    """What an estimate reads of a recipe's models, built once (on the meta device) for every candidate."""

    student: Any
    out_dim: int
    teacher_info: Any


def umt_models(recipe: Recipe, arch: Any) -> UMTModels:
    """The student (meta device) and the teacher tower's planner facts of a ``task: umt`` recipe."""
    from avion_ds.tasks.umt.model import UMTStudent  # lazy: heavy (timm, torchvision)

    u = recipe.umt
    tower = tower_arch(u.teacher_model, u.clip_input_resolution)
    out_dim = int(tower.proj_dim)
    with meta_device():
        student = UMTStudent(arch, out_dim, u.clip_return_layer, u.clip_student_return_interval)
    return UMTModels(student, out_dim, arch_info_of_tower(tower))


def umt_estimator(recipe: Recipe, arch: Any) -> Any:
    """:func:`umt_estimate` for ``recipe`` with its models built once: the planner's ``Request.estimator``
    (hundreds of candidates; building the models per candidate took ~0.05 s each)."""
    return functools.partial(umt_estimate, recipe, arch, models=umt_models(recipe, arch))


def umt_estimate(
    recipe: Recipe,
    arch: Any,
    micro_batch: int,
    dtype: Any,
    zero_stage: int,
    teacher_autocast: bool = True,
    models: UMTModels | None = None,
    **knobs: Any,
) -> MemoryEstimate:
    """:func:`avion_ds.memory.estimate.estimate` for a ``task: umt`` recipe's step: the student's model
    states as the planner counts them, its visible-token activations, the replicated float32 teacher and
    what its forward holds (module doc). ``arch``: the student's ``ViTArch`` (``task.student_geometry``);
    ``knobs``: ``estimate``'s keywords (offload, checkpointing, world size, buckets, ``checkpoint_policy``)."""
    u, d = recipe.umt, recipe.data
    built = models or umt_models(recipe, arch)
    student, out_dim = built.student, built.out_dim
    checkpointing = knobs.get("checkpointing", False)
    policy = knobs.get("checkpoint_policy", "full")
    base = estimate(student, d.num_frames, d.size, micro_batch, dtype, zero_stage, **knobs)
    grid = arch.grid
    visible = visible_tokens(grid, u.mask_type, u.mask_ratio)
    info, s = arch_info(student), DTYPE_BYTES[as_dtype(dtype)]
    backend = "eager" if info.attn_backend == "eager" else "sdpa"
    recompute = micro_batch * block_activation_bytes(info, visible, s, backend) if checkpointing else 0
    workspace = base.workspace - micro_batch * math.prod(grid) * s * (2 * info.mlp_hidden + 4 * info.embed_dim)
    workspace += micro_batch * visible * s * (2 * info.mlp_hidden + 4 * info.embed_dim)  # on the visible tokens
    first_n = knobs.get("first_n")
    act = micro_batch * student_activation_bytes(student, visible, out_dim, dtype, checkpointing, policy, first_n)
    held = micro_batch * teacher_held_bytes(u.clip_return_layer, out_dim, grid)
    # the teacher's forward runs under bf16 / fp16 autocast on CUDA (what a plan is for); teacher_autocast=False:
    # float32 throughout, as on CPU
    autocast = 2 if teacher_autocast else 4
    teacher_info = built.teacher_info
    one = teacher_forward_peak(
        teacher_info, d.num_frames, d.size, u.clip_input_resolution, u.clip_return_layer, out_dim, autocast
    )
    weight_cast = teacher_info.embed_dim * teacher_info.mlp_hidden * autocast if teacher_autocast else 0
    peak = micro_batch * one + weight_cast  # fc2's weight cast: once per step, not per clip
    teacher_params = 4 * teacher_info.params
    step_act = max(act + held, peak)
    allocated = base.params + teacher_params + base.grads + base.optimizer + step_act + recompute + workspace
    frag = int(FRAGMENTATION * allocated)
    inputs = {**base.inputs, "task": "umt", "teacher": u.teacher_model, "teacher_params": teacher_info.params}
    inputs.update(visible_tokens=visible, student_activations=act, teacher_bytes=teacher_params)
    inputs.update(teacher_forward_peak=peak, teacher_held=held)
    return dataclasses.replace(
        base,
        params=base.params + teacher_params,
        activations=step_act,
        recompute=recompute,
        workspace=workspace,
        fragmentation=frag,
        allocated_peak=allocated,
        total=allocated + frag + base.context,
        inputs=inputs,
    )


def arch_info_of_tower(tower: Any) -> Any:
    """The planner's facts of the teacher's tower (built on the meta device: nothing allocated)."""
    from avion_ds.models.vit.model import VideoViT  # lazy: heavy (timm, torchvision)

    with meta_device():
        return arch_info(VideoViT(tower))


def teacher_parameter_bytes(teacher_model: str, resolution: int) -> int:
    """The float32 bytes of ``teacher_model``'s video tower at ``resolution`` px: what every rank holds."""
    return 4 * arch_info_of_tower(tower_arch(teacher_model, resolution)).params

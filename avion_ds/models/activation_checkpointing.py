"""Activation checkpointing applied by wrapping a built model's blocks (never a constructor flag).

Each selected block keeps its module and parameter names (state dicts, layer-wise lr decay and
ZeRO-3 partitioning are untouched); only its ``forward`` is replaced by one that recomputes the
original forward in backward:

* ``impl="torch"``: non-reentrant ``torch.utils.checkpoint.checkpoint``;
* ``impl="deepspeed"``: ``deepspeed.checkpointing.checkpoint``, so the DeepSpeed config's
  ``activation_checkpointing`` section (cpu_checkpointing, ...) takes effect once the engine
  has called ``deepspeed.checkpointing.configure``.

Recompute calls the block's submodules through ``__call__``, so ZeRO-3 gathers their parameters
again in backward (the blocks hold no parameters of their own).

``policy`` says what a checkpointed block keeps:

* ``full``: only its input; backward re-runs the whole block once;
* ``selective`` (``impl="torch"`` only): torch's op-level selective checkpointing
  (``create_selective_checkpoint_contexts``): the attention kernel's outputs and the q/k/v
  projection's output are saved (``MUST_SAVE``), everything else (norms, activation, residual adds,
  the output projection and the MLP's first linear) is recomputed (``PREFER_RECOMPUTE``). Backward
  then needs neither attention nor the q/k/v matmul again; the MLP's second linear is never
  recomputed (recompute stops once backward has what it needs).

Either way a checkpointed block's MLP runs the plain ``act -> fc2`` (``GeluLinear.fold = False``):
the block recompute already re-runs the activation, folding would run it a third time. Tensors the
selective policy keeps go through the surrounding saved-tensor hooks (``respect_saved_tensors_hooks``),
so ``memory.activations.SavedTensorTracker`` counts them and offload hooks see them.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from avion_ds.models.mlp import GeluLinear

logger = logging.getLogger(__name__)
IMPLS = ("torch", "deepspeed")
POLICIES = ("full", "selective")
_ATTR = "_avion_ckpt_impl"


def _attention_ops() -> frozenset[Any]:
    """Fused attention kernels whose outputs a selective checkpoint keeps (those this torch has)."""
    names = (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "bmm",  # eager attention (q k^T, probs v); the block's linears run addmm / mm
    )
    ops = {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}
    flash = getattr(getattr(torch.ops, "flash_attn", None), "_flash_attn_forward", None)
    if flash is not None:  # flash-attn >= 2.6 registers its kernel as a torch custom op
        ops.add(flash.default)
    return frozenset(ops)


_MATMUL_OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """MUST_SAVE the attention kernels' outputs and the q/k/v projection's (the one matmul whose
    output is 3x its input width); PREFER_RECOMPUTE everything else."""
    if op in _SAVED_OPS:
        return CheckpointPolicy.MUST_SAVE
    if op in _MATMUL_OPS:
        weight = args[-1]  # mm(x, w^T) / addmm(b, x, w^T): w^T is (in, out)
        if weight.dim() == 2 and weight.shape[1] == 3 * weight.shape[0]:
            return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_recompute_share(embed_dim: int, mlp_hidden: int, tokens: int) -> float:
    """Share of a block's forward multiply-adds that backward re-runs under the ``selective`` policy:
    the output projection (D^2 per token) and fc1 (D F), out of q/k/v (3 D^2), attention (2 N D),
    the projection, fc1 and fc2 (D F each). The planner's cost model uses it (``full`` re-runs 1)."""
    d, f, n = embed_dim, mlp_hidden, tokens
    return (d * d + d * f) / (4 * d * d + 2 * d * f + 2 * n * d)


_SAVED_OPS = _attention_ops()
_HOOKS_KW = "respect_saved_tensors_hooks" in inspect.signature(torch_checkpoint).parameters


def _selective_contexts() -> tuple[Any, Any]:
    return create_selective_checkpoint_contexts(selective_policy)


def _torch_ckpt(fn: Callable[..., Any], *args: Any) -> Any:
    return torch_checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True)


def _torch_selective_ckpt(fn: Callable[..., Any], *args: Any) -> Any:
    extra = {"respect_saved_tensors_hooks": True} if _HOOKS_KW else {}
    return torch_checkpoint(
        fn, *args, use_reentrant=False, preserve_rng_state=True, context_fn=_selective_contexts, **extra
    )


def _deepspeed_ckpt(fn: Callable[..., Any], *args: Any) -> Any:
    import deepspeed  # lazy: heavy, only impl='deepspeed' needs it

    return deepspeed.checkpointing.checkpoint(fn, *args)


def _checkpointed_forward(block: nn.Module, run: Callable[..., Any], *args: Any) -> Any:
    if not torch.is_grad_enabled():  # eval / no_grad: nothing to save, run plainly
        return type(block).forward(block, *args)
    return run(functools.partial(type(block).forward, block), *args)


def _select(num_blocks: int, every: int, first_n: int | None) -> list[int]:
    if every < 1:
        raise ValueError(f"activation checkpointing: expected every >= 1, got {every}")
    if first_n is not None and first_n < 0:
        raise ValueError(f"activation checkpointing: expected first_n >= 0 or None, got {first_n}")
    limit = num_blocks if first_n is None else min(first_n, num_blocks)
    return [i for i in range(limit) if i % every == 0]


def block_groups(model: nn.Module, what: str) -> list[nn.ModuleList]:
    """The transformer blocks of ``model`` (or of the model inside a DeepSpeed engine / DDP wrapper):
    ``[model.blocks]``, or each tower's blocks for a model with ``block_lists()``."""
    target = model if getattr(model, "blocks", None) is not None else getattr(model, "module", None)
    blocks = getattr(target, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"{what}: expected a model with .blocks (nn.ModuleList), got {type(model).__name__}")
    return target.block_lists() if callable(getattr(target, "block_lists", None)) else [blocks]


def compile_blocks(model: nn.Module) -> int:
    """``torch.compile`` each transformer block in place (regional compilation, as torchtitan does);
    returns how many. Apply after activation checkpointing: the compiled call wraps the checkpointed
    forward, and parameter names / state dicts are unchanged (``nn.Module.compile``). With
    ``TORCHDYNAMO_DISABLE=1`` in the environment torch runs them eager, which is stated in one line."""
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        logger.warning("model.compile: TORCHDYNAMO_DISABLE=1 is set, so torch runs the blocks eager (not compiled)")
    n = 0
    for group in block_groups(model, "model.compile"):
        for block in group:
            block.compile()
            n += 1
    return n


def _set_fold(block: nn.Module, fold: bool) -> None:
    for m in block.modules():
        if isinstance(m, GeluLinear):
            m.fold = fold


def apply_activation_checkpointing(
    model: nn.Module, every: int = 1, first_n: int | None = None, impl: str = "torch", policy: str = "full"
) -> nn.Module:
    """Checkpoint every ``every``-th block among the first ``first_n`` (None = all) of ``model.blocks``;
    of each tower's blocks for a model with ``block_lists()`` (the video-text dual encoder).
    ``policy``: ``full`` or ``selective`` (see the module docstring).

    Idempotent: re-applying replaces the previous selection. Returns ``model`` (modified in place).
    """
    if impl not in IMPLS:
        raise ValueError(f"activation checkpointing: impl expected one of {', '.join(IMPLS)}, got {impl!r}")
    if policy not in POLICIES:
        raise ValueError(f"activation checkpointing: policy expected one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "selective" and impl != "torch":
        raise ValueError(f"activation checkpointing: policy 'selective' needs impl 'torch', got {impl!r}")
    lists = block_groups(model, "activation checkpointing")
    remove_activation_checkpointing(model)
    run = _deepspeed_ckpt if impl == "deepspeed" else _torch_selective_ckpt if policy == "selective" else _torch_ckpt
    if impl == "deepspeed":
        import deepspeed  # noqa: F401  # lazy: heavy; imported now to fail here, not in the first forward, when missing
    for group in lists:
        for i in _select(len(group), every, first_n):
            block = group[i]
            block.forward = functools.partial(_checkpointed_forward, block, run)  # type: ignore[method-assign]
            setattr(block, _ATTR, impl if policy == "full" else f"{impl}:{policy}")
            _set_fold(block, False)
    return model


def apply_configured(model: nn.Module, cfg: Any) -> nn.Module:
    """``apply_activation_checkpointing`` with a recipe's ``model`` section (``activation_checkpoint_every``,
    ``activation_checkpoint_first_n``, ``activation_checkpoint_impl``, ``activation_checkpoint_policy``)."""
    return apply_activation_checkpointing(
        model,
        cfg.activation_checkpoint_every,
        cfg.activation_checkpoint_first_n,
        cfg.activation_checkpoint_impl,
        cfg.activation_checkpoint_policy,
    )


def remove_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Undo ``apply_activation_checkpointing`` (restore the class forward on every block)."""
    blocks = getattr(model, "blocks", None) or getattr(getattr(model, "module", None), "blocks", [])
    for block in blocks:
        if hasattr(block, _ATTR):
            del block.forward
            delattr(block, _ATTR)
            _set_fold(block, True)
    return model


def checkpoint_policies(model: nn.Module) -> dict[int, str]:
    """{block index: policy} of the blocks currently checkpointed (the policy ``apply_activation_checkpointing``
    wrapped each with, e.g. ``"torch"``, ``"torch:selective"``); the memory estimate counts them with
    :func:`~avion_ds.memory.estimate.count_checkpointed_blocks`."""
    return {i: getattr(b, _ATTR) for i, b in enumerate(getattr(model, "blocks", [])) if hasattr(b, _ATTR)}

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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

IMPLS = ("torch", "deepspeed")
_ATTR = "_avion_ckpt_impl"


def _torch_ckpt(fn: Callable[..., Any], *args: Any) -> Any:
    return torch_checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True)


def _deepspeed_ckpt(fn: Callable[..., Any], *args: Any) -> Any:
    import deepspeed

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


def apply_activation_checkpointing(
    model: nn.Module, every: int = 1, first_n: int | None = None, impl: str = "torch"
) -> nn.Module:
    """Checkpoint every ``every``-th block among the first ``first_n`` (None = all) of ``model.blocks``;
    of each tower's blocks for a model with ``block_lists()`` (the video-text dual encoder).

    Idempotent: re-applying replaces the previous selection. Returns ``model`` (modified in place).
    """
    if impl not in IMPLS:
        raise ValueError(f"activation checkpointing: impl expected one of {', '.join(IMPLS)}, got {impl!r}")
    target = model if getattr(model, "blocks", None) is not None else getattr(model, "module", None)
    blocks = getattr(target, "blocks", None)  # else a DeepSpeed engine / DDP wrapper around the model
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(
            f"activation checkpointing: expected a model with .blocks (nn.ModuleList), got {type(model).__name__}"
        )
    lists = target.block_lists() if callable(getattr(target, "block_lists", None)) else [blocks]
    remove_activation_checkpointing(model)
    run = _torch_ckpt if impl == "torch" else _deepspeed_ckpt
    if impl == "deepspeed":
        import deepspeed  # noqa: F401  (fail now, not in the first forward, when it is missing)
    for group in lists:
        for i in _select(len(group), every, first_n):
            block = group[i]
            block.forward = functools.partial(_checkpointed_forward, block, run)  # type: ignore[method-assign]
            setattr(block, _ATTR, impl)
    return model


def remove_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Undo ``apply_activation_checkpointing`` (restore the class forward on every block)."""
    blocks = getattr(model, "blocks", None) or getattr(getattr(model, "module", None), "blocks", [])
    for block in blocks:
        if hasattr(block, _ATTR):
            del block.forward
            delattr(block, _ATTR)
    return model


def checkpointed_blocks(model: nn.Module) -> dict[int, str]:
    """{block index: impl} for the blocks currently checkpointed."""
    return {i: getattr(b, _ATTR) for i, b in enumerate(getattr(model, "blocks", [])) if hasattr(b, _ATTR)}

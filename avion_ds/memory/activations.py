"""Exact activation memory: the bytes autograd keeps for backward after one forward pass.

Every tensor that autograd saves for backward goes through the pack hook of
``torch.autograd.graph.saved_tensors_hooks``; we record its storage once (views such as the q/k/v
slices of one qkv projection share a storage and count once) and skip parameters and buffers
(they are model state, not activations). With non-reentrant activation checkpointing the
checkpoint installs its own, inner hook for the checkpointed region, so only what really stays
alive (each checkpointed segment's input) reaches ours; what a selective checkpoint caches
(``policy="selective"``) reaches ours too (``respect_saved_tensors_hooks``). The count is device independent: it works
on CPU in tests and gives the same number a GPU would keep (for the same attention kernel family).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from torch import nn

from avion_ds.models import apply_activation_checkpointing
from avion_ds.models.clip.model import ClipArch


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    s = t.untyped_storage()
    # _cdata is the StorageImpl address: unique per storage also on the meta device (data_ptr 0)
    return (str(t.device), int(getattr(s, "_cdata", 0) or s.data_ptr()))


@dataclass
class SavedTensorStats:
    """What autograd saved during the tracked region."""

    bytes: int = 0
    num_storages: int = 0
    num_saves: int = 0  # pack-hook calls, duplicates and parameters included
    by_dtype: dict[str, int] = field(default_factory=dict)


class SavedTensorTracker:
    """Context manager summing unique saved-for-backward storages, excluding ``exclude``'s state.

    >>> with SavedTensorTracker(model) as tr:
    ...     out = model(x)
    >>> tr.stats.bytes
    """

    def __init__(self, exclude: nn.Module | None = None) -> None:
        self._excluded: set[tuple[str, int]] = set()
        if exclude is not None:
            for t in list(exclude.parameters()) + list(exclude.buffers()):
                self._excluded.add(_storage_key(t))
        self._seen: dict[tuple[str, int], torch.UntypedStorage] = {}
        self.stats = SavedTensorStats()
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.stats.num_saves += 1
        key = _storage_key(t)
        if key not in self._excluded and key not in self._seen:
            storage = t.untyped_storage()
            self._seen[key] = storage  # keep alive so the address cannot be reused while tracking
            nbytes = int(storage.nbytes())
            self.stats.bytes += nbytes
            self.stats.num_storages += 1
            name = str(t.dtype).replace("torch.", "")
            self.stats.by_dtype[name] = self.stats.by_dtype.get(name, 0) + nbytes
        return t

    def __enter__(self) -> Self:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self._seen.clear()


def _model_input(model: nn.Module, frames: int | None, size: int | None, batch: int) -> torch.Tensor:
    p = next(model.parameters())
    t = int(frames if frames is not None else model.num_frames)
    s = int(size if size is not None else model.img_size)
    if isinstance(getattr(model, "img_size", None), (tuple, list)) and size is None:
        s = int(model.img_size[0])
    return torch.randn(batch, 3, t, s, s, device=p.device, dtype=p.dtype)


def _default_inputs(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(x,)``, or ``(x, tokens)`` for a video-text dual encoder (its architecture says so; captions of
    its text tower's full context)."""
    arch = getattr(model, "arch", None)
    if not isinstance(arch, ClipArch):
        return (x,)
    tokens = torch.ones(x.shape[0], arch.text.context_length, dtype=torch.int64, device=x.device)
    tokens[:, -1] = 2  # the end-of-text token: the row's largest id
    return (x, tokens)


def measure_activation_bytes(
    model: nn.Module,
    inputs: torch.Tensor | tuple[int, int, int] | None = None,
    *,
    checkpointing: bool | int = False,
    first_n: int | None = None,
    impl: str = "torch",
    policy: str = "full",
    train: bool = True,
    forward: Callable[[nn.Module, torch.Tensor], Any] | None = None,
    return_stats: bool = False,
) -> int | SavedTensorStats:
    """Bytes saved for backward by one forward of ``model`` on ``inputs``.

    ``inputs``: a (B, C, T, H, W) tensor, or ``(frames, size, batch)`` to build a random one in the
    model's dtype/device, or None for one clip at the model's default frames/size.
    ``checkpointing``: False, True (every block) or k (every k-th block), applied to a deep copy
    through ``avion_ds.models.apply_activation_checkpointing`` with ``impl`` and ``policy`` (``full`` |
    ``selective``; the caller's model is unchanged).
    ``forward``: custom call (e.g. for a Hugging Face model); default ``model(x)``, and for a
    video-text dual encoder ``model(x, tokens)`` with one full-context caption per clip.
    Returns the byte count, or the full :class:`SavedTensorStats` with ``return_stats``.
    """
    if isinstance(inputs, torch.Tensor):
        x = inputs
    elif inputs is None:
        x = _model_input(model, None, None, 1)
    else:
        frames, size, batch = inputs
        if batch <= 0 or frames <= 0 or size <= 0:
            raise ValueError(f"inputs={inputs!r}: frames, size and batch must be positive")
        x = _model_input(model, frames, size, batch)
    net = model
    if checkpointing:
        every = 1 if checkpointing is True else int(checkpointing)
        net = apply_activation_checkpointing(
            copy.deepcopy(model), every=every, first_n=first_n, impl=impl, policy=policy
        )
    was_training = net.training
    net.train(train)
    try:
        with torch.enable_grad(), SavedTensorTracker(exclude=net) as tracker:
            out = forward(net, x) if forward is not None else net(*_default_inputs(net, x))
        del out
    finally:
        net.train(was_training)
    return tracker.stats if return_stats else tracker.stats.bytes

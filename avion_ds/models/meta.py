"""Models built on the meta device for their shapes alone: parameter counts, memory plans, a checkpoint's fit.

A meta tensor has a shape and no values, so the weight init a constructor runs has nothing to set; torch still
dispatches each init op through its meta decompositions (timm's ``trunc_normal_``: ``uniform_``, ``erfinv_``,
``clamp_``): 0.07 s of a ViT-B build, 0.12 s of a ViT-L one, ~4 s of a ~5.5 s ``avion-ds models`` listing
(2-core VM). ``meta_device`` skips them (``bench/startup.py --parts meta``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# in-place ops that only set values (weight init); shape-changing ones (resize_, t_, ...) still run
_VALUE_OPS = frozenset(
    {"uniform_", "normal_", "trunc_normal_", "erfinv_", "mul_", "add_", "sub_", "div_", "clamp_", "fill_", "zero_"}
    | {"copy_", "exp_", "log_", "abs_", "neg_", "bernoulli_", "exponential_", "random_", "constant_", "ones_"}
)


class _SkipValueOpsOnMeta(TorchFunctionMode):
    """Value-setting in-place ops on meta tensors return the tensor as it is."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        target = args[0] if args else None
        if getattr(func, "__name__", "") in _VALUE_OPS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """``torch.device("meta")`` for shape-only builds, their weight init skipped (nothing is allocated or drawn).
    For construction only: a forward pass under it would skip its in-place value ops, and the tensors they save
    (activation counts on the meta device run under plain ``torch.device("meta")``)."""
    with torch.device("meta"), _SkipValueOpsOnMeta():
        yield

"""In-place edits of a parameter that reach DeepSpeed's fp32 master copy, wherever it lives.

After an optimizer step the module tensor is only a copy under mixed precision or ZeRO: the next step
starts again from the fp32 master (ZeRO-1/2 and the bf16 optimizer: this rank's fragment of a flat
partition; ZeRO-3: the partitioned parameter; fp16 ZeRO-0: ``FP16_Optimizer``'s flat fp32 groups). An
edit of the module tensor alone would be undone by the next step. :func:`clamp_parameter_` clamps every
copy this rank holds (no collective: each rank clamps its own partition).
"""

from __future__ import annotations

from typing import Any

import torch


def _fp16_master(optimizer: Any, param: torch.Tensor) -> torch.Tensor | None:
    """``param``'s slice of ``FP16_Optimizer``'s flat fp32 group (fp16 ZeRO-0), or None."""
    groups, flats = getattr(optimizer, "fp16_groups", None), getattr(optimizer, "fp32_groups_flat", None)
    if not groups or flats is None:
        return None
    for group, flat in zip(groups, flats):
        offset = 0
        for p in group:
            if p is param:
                return flat.narrow(0, offset, p.numel())
            offset += p.numel()
    return None


@torch.no_grad()
def clamp_parameter_(optimizer: Any, param: torch.Tensor, low: float, high: float) -> None:
    """Clamp ``param`` to [low, high] in the module and in the fp32 master copy ``optimizer`` steps
    (``engine.optimizer``: DeepSpeed's wrapper, or the plain optimizer of fp32 ZeRO-0)."""
    if hasattr(param, "ds_id"):  # ZeRO-3: this rank's fp32 partition and its low-precision copy (DeepSpeed's
        # local API; the full-parameter setter fails on a parameter smaller than the world, e.g. the 1-element t)
        from deepspeed.utils import (  # lazy: deepspeed takes seconds to import
            safe_get_local_fp32_param,
            safe_set_local_fp32_param,
        )

        safe_set_local_fp32_param(param, safe_get_local_fp32_param(param).clamp(low, high))
        param.ds_tensor.data.clamp_(low, high)
        return
    mapping = getattr(param, "_hp_mapping", None)
    if mapping is not None:  # ZeRO-1/2, bf16 optimizer: this rank's fp32 fragment
        mapping.get_hp_fragment().data.clamp_(low, high)
    master = _fp16_master(optimizer, param)
    if master is not None:
        master.clamp_(low, high)
    param.data.clamp_(low, high)

"""DeepSpeed's Lion with the sign of a zero update direction taken as 0, as the official Lion and AVION do.

Lion moves each weight by ``-lr * sign(beta1 * m + (1 - beta1) * g)`` after the decoupled weight decay.
The official implementation and AVION's ``avion/optim/lion.py`` use ``sign_()``, so a weight whose
gradient and momentum are both zero gets the decay alone. DeepSpeed's kernels (``DeepSpeedCPULion``'s
SIMD path and ``FusedLion``'s CUDA one) put the sign on the lr with ``copysign``, and ``copysign(lr, 0)``
is ``lr``: such a weight moves by ``lr`` every step. In a dual encoder almost every row of the token
embedding gets no gradient in a batch (49,403 of 49,408 in one observed batch), so those rows drift.

:func:`guard_zero_direction` wraps the optimizer's ``step``: before it, the entries whose direction is
exactly zero are found per tensor (one comparison; the values of only those entries are kept); after it,
they are put back to ``p * (1 - lr * wd)``, AVION's ``param.mul_(1 - lr * wd)`` (bit-unchanged where the
group has no weight decay). On a GPU each tensor costs one elementwise pass and one ``any()`` (a host
sync per tensor: a handful under ZeRO-1/2's flat partitions, one per parameter under ZeRO-0).
"""

from __future__ import annotations

from typing import Any

import torch

LION_TYPES = ("DeepSpeedCPULion", "FusedLion")  # DeepSpeed's Lion optimizers (deepspeed.ops.lion)


def is_deepspeed_lion(optimizer: Any) -> bool:
    """Whether ``optimizer`` is one of DeepSpeed's Lion optimizers."""
    return type(optimizer).__name__ in LION_TYPES


def _zero_direction(optimizer: torch.optim.Optimizer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]:
    """(param, mask, kept values, decay factor) of every tensor with entries whose update direction is 0."""
    kept = []
    for group in optimizer.param_groups:
        beta1 = float(group["betas"][0])
        factor = 1.0 - float(group["lr"]) * float(group.get("weight_decay", 0.0))
        for p in group["params"]:
            if p.grad is None:
                continue
            m = optimizer.state[p].get("exp_avg") if p in optimizer.state else None
            g = p.grad.float()
            direction = g * (1.0 - beta1) if m is None else m.float() * beta1 + g * (1.0 - beta1)
            mask = direction == 0
            if bool(mask.any()):
                kept.append((p, mask, p.detach()[mask].clone(), factor))
    return kept


def guard_zero_direction(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``optimizer`` (a DeepSpeed Lion) leave zero-direction entries to the weight decay alone (module doc)."""
    if getattr(optimizer, "_zero_direction_guard", False):
        return optimizer
    inner = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            kept = _zero_direction(optimizer)
        out = inner(*args, **kwargs)
        with torch.no_grad():
            for p, mask, old, factor in kept:
                p.data[mask] = old if factor == 1.0 else old.mul_(factor)
        return out

    optimizer.step = step  # type: ignore[method-assign]
    optimizer._zero_direction_guard = True  # type: ignore[attr-defined]
    return optimizer

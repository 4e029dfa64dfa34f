"""Per-iteration cosine learning-rate schedule with linear warmup, honouring group ``lr_scale``; optionally
a cosine weight-decay schedule on the decayed groups (VideoMAE / AVION ``weight_decay_end``).

Written as a tiny stateful object with ``step/state_dict/load_state_dict`` so that DeepSpeed saves
and restores it inside its checkpoints when handed to ``deepspeed.initialize(lr_scheduler=...)``;
DeepSpeed calls ``step()`` once per optimizer step (after gradient accumulation).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def cosine_lr(
    step: int, base_lr: float, min_lr: float, warmup_steps: int, total_steps: int, warmup_start: float | None = None
) -> float:
    """lr at optimizer step ``step``: linear warmup, then cosine base -> min_lr. The warmup is
    ``base * (step + 1) / warmup`` or, with ``warmup_start``, AVION / BEiT's ``cosine_scheduler``
    ``np.linspace(warmup_start, base, warmup)`` (``start_warmup_value``: first step at the start, last at base)."""
    if warmup_steps > 0 and step < warmup_steps:
        if warmup_start is None:
            return base_lr * (step + 1) / warmup_steps
        if warmup_steps == 1:
            return warmup_start
        return warmup_start + (base_lr - warmup_start) * step / (warmup_steps - 1)
    if total_steps <= warmup_steps:
        return base_lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def cosine_wd(step: int, start: float, end: float, total_steps: int) -> float:
    """Weight decay at optimizer step ``step``: cosine ``start`` -> ``end`` over ``total_steps``, no warmup
    (VideoMAE's ``cosine_scheduler(wd, wd_end, epochs, iters)``); ``end`` from ``total_steps`` on."""
    if total_steps <= 0:
        return end
    progress = min(1.0, step / total_steps)
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """Sets ``group["lr"] = cosine_lr(step) * group.get("lr_scale", 1)`` for every param group, and with
    ``weight_decay=(start, end)`` ``group["weight_decay"] = cosine_wd(step)`` for the groups that decay (weight
    decay > 0 when the schedule is made: norms, biases and embeddings keep 0)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base_lr: float,
        min_lr: float,
        warmup_steps: int,
        total_steps: int,
        weight_decay: tuple[float, float] | None = None,
        warmup_start: float | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.warmup_start = warmup_start
        self.base_lr = base_lr
        self.min_lr = min_lr
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.weight_decay = weight_decay
        self.decayed = [float(g.get("weight_decay", 0.0)) > 0 for g in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def lr(self) -> float:
        """Unscaled lr for the next optimizer step."""
        return cosine_lr(
            self.last_step, self.base_lr, self.min_lr, self.warmup_steps, self.total_steps, self.warmup_start
        )

    def wd(self) -> float | None:
        """Weight decay of the decayed groups for the next optimizer step (None: no schedule)."""
        if self.weight_decay is None:
            return None
        return cosine_wd(self.last_step, *self.weight_decay, self.total_steps)

    def _apply(self) -> None:
        lr, wd = self.lr(), self.wd()
        for g, decayed in zip(self.optimizer.param_groups, self.decayed):
            g["lr"] = lr * g.get("lr_scale", 1.0)
            if wd is not None and decayed:
                g["weight_decay"] = wd

    def step(self, *_: Any, **__: Any) -> None:
        """Advance one optimizer step."""
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step,
            "base_lr": self.base_lr,
            "min_lr": self.min_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "warmup_start": self.warmup_start,
            **({} if self.weight_decay is None else {"weight_decay": list(self.weight_decay)}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self._apply()


def decayed_weight_decay(optimizer: torch.optim.Optimizer) -> float:
    """The largest group weight decay: the decayed groups' (scheduled by ``optim.weight_decay_end``)."""
    return max(float(g.get("weight_decay", 0.0)) for g in optimizer.param_groups)

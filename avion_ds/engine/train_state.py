"""What the training loop keeps between steps, and the small helpers of one step.

``TrainState`` is where training stands (a checkpoint's client state); ``TrainData`` is what
``Trainer.fit`` iterates; ``StepWindow`` holds one accumulation window on the device until its
boundary; ``LogInterval`` collects what the next logged row reports (engine/trainer.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


class NonFiniteLoss(RuntimeError):
    """Raised under ``nonfinite: stop`` or after ``nonfinite_max_consecutive``; exit 3, nothing saved."""


@dataclass
class TrainState:
    """Where training stands; saved as (and restored from) the checkpoint's client state.

    ``epoch`` / ``step_in_epoch``: the position a resume starts at; ``global_step``: windows consumed
    (the data position, applied or not); ``skipped``: non-finite micro-batches; ``bad_samples``:
    unreadable inputs the loader replaced; ``applied_steps`` / ``overflow_steps``: optimizer updates
    applied / dropped by an fp16 loss-scale overflow.
    """

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    skipped: int = 0
    bad_samples: int = 0
    applied_steps: int = 0
    overflow_steps: int = 0

    def state_dict(self) -> dict[str, int]:
        """The counters as a dict (the checkpoint's client state keys)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a client state (keys older checkpoints lack get their defaults)."""
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        self.skipped = int(state.get("skipped", 0))
        self.bad_samples = int(state.get("bad_samples", 0))
        self.applied_steps = int(state.get("applied_steps", self.global_step))
        self.overflow_steps = int(state.get("overflow_steps", 0))


@dataclass
class StepWindow:
    """One accumulation window, on the device until its boundary."""

    losses: list[torch.Tensor] = field(default_factory=list)  # this rank's loss per micro-batch
    heads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    bad_msgs: list[str] = field(default_factory=list)
    fatal_msgs: list[str] = field(default_factory=list)
    bad_count: int = 0


@dataclass
class LogInterval:
    """What the next logged row reports: the steps since the previous logged one."""

    steps: int = 0
    timed: int = 0  # steps since t0 (a restart drops the time of evaluation, saving, loader start-up)
    loss: float = 0.0
    n: int = 0
    heads: dict[str, torch.Tensor] = field(default_factory=dict)
    weight_decay: float | None = None  # of the decayed groups, used by the logged step
    data_s: float = 0.0
    t0: float = field(default_factory=time.perf_counter)


def to_device(labels: Any, device: torch.device) -> Any:
    """Labels (a tensor, or a dict of them) on ``device``, without waiting for the copy."""
    if isinstance(labels, dict):
        return {k: v.to(device, non_blocking=True) for k, v in labels.items()}
    return labels.to(device, non_blocking=True)


def zero0_grad_norm_tensor(engine: Any, loss_scale: float | None = None) -> torch.Tensor | None:
    """Pre-clipping grad norm for ZeRO-0 as a device tensor (DeepSpeed records it only for ZeRO >= 1)."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return None
    norm = torch.nn.utils.get_total_norm([g.float() for g in grads])  # fused (foreach) norms
    return norm / loss_scale if loss_scale else norm


def as_float(x: Any) -> float | None:
    """``float(x)`` (a host read for a tensor), or None when ``x`` is None or not a number."""
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


@dataclass
class TrainData:
    """What ``Trainer.fit`` iterates: loaders, their datasets (epoch seeding), eval augment, epoch length."""

    train_loader: torch.utils.data.DataLoader
    val_loader: torch.utils.data.DataLoader
    train_set: Any
    val_set: Any
    eval_aug: Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]]
    steps_per_epoch: int

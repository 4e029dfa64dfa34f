"""Training losses: cross-entropy with label smoothing, soft-target CE (mixup/cutmix), EPIC verb+noun sum."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def classification_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """CE for int targets (with label smoothing) or soft-target CE for float (B, K) targets."""
    logits = logits.float()
    if target.is_floating_point():
        if target.shape != logits.shape:
            raise ValueError(f"soft targets {tuple(target.shape)} do not match logits {tuple(logits.shape)}")
        return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()
    return F.cross_entropy(logits, target.long(), label_smoothing=label_smoothing)


def total_loss(
    outputs: Tensor | dict[str, Tensor], targets: Tensor | dict[str, Tensor], label_smoothing: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss for one batch: single head, or the sum over heads (EPIC: verb + noun).

    Returns the loss and the detached per-head values for logging (device tensors: reading them is a
    host sync, done only on logged steps).
    """
    if isinstance(outputs, dict):
        if not isinstance(targets, dict) or set(targets) != set(outputs):
            got = sorted(targets) if isinstance(targets, dict) else type(targets).__name__
            raise ValueError(f"model heads {sorted(outputs)} do not match target heads {got}")
        parts = {h: classification_loss(outputs[h], targets[h], label_smoothing) for h in outputs}
        loss = sum(parts.values())
        return loss, {h: v.detach() for h, v in parts.items()}
    if isinstance(targets, dict):
        raise ValueError(f"single-head model got targets for heads {sorted(targets)}")  # noqa: TRY004 - a mismatch of heads, not of types
    return classification_loss(outputs, targets, label_smoothing), {}

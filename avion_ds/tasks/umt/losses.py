"""UMT's distillation losses, as the reference's engine computes them (``clip_loss_type``): ``l2`` =
mean(2 - 2 <student, teacher>) over the l2-normalised features, ``mse`` = ``nn.MSELoss``, ``smooth_l1`` =
``nn.SmoothL1Loss`` (beta 1); the teacher's features are taken at the student's visible positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def visible_targets(feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The teacher's features (K, B, N, C) at the visible positions of ``mask`` (B, N) -> (K, B, N_vis, C)."""
    K, B, _, C = feats.shape
    return feats[:, ~mask].reshape(K, B, -1, C)


def per_clip_loss(student: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """The loss of each clip (B,), float32: its mean over layers, tokens (and channels for mse / smooth_l1).
    Every clip has as many visible tokens, so the mean over clips is the reference's loss."""
    s, t = student.float(), target.float()
    if kind == "l2":
        return (2 - 2 * (s * t).sum(dim=-1)).mean(dim=(0, 2))
    if kind == "mse":
        return F.mse_loss(s, t, reduction="none").mean(dim=(0, 2, 3))
    if kind == "smooth_l1":
        return F.smooth_l1_loss(s, t, reduction="none").mean(dim=(0, 2, 3))
    raise ValueError(f"umt.clip_loss_type={kind!r} is not one of l2, mse, smooth_l1")


def distill_loss(student: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """The batch's distillation loss (a scalar), before ``clip_loss_ratio``."""
    return per_clip_loss(student, target, kind).mean()

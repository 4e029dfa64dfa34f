"""Multi-view evaluation: average the softmax scores of a sample's T x S views."""

from __future__ import annotations

import torch


def aggregate_views(logits: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
    """(N, V, K) logits -> (N, K) mean of per-view softmax (dicts: per head)."""
    if isinstance(logits, dict):
        return {k: aggregate_views(v) for k, v in logits.items()}
    if logits.dim() != 3:
        raise ValueError(f"aggregate_views expects (N, V, K) logits, got shape {tuple(logits.shape)}")
    return logits.float().softmax(dim=-1).mean(dim=1)


def split_views(flat: torch.Tensor | dict[str, torch.Tensor], views: int):
    """(N*V, K) model outputs (from x (B*V, C, T, H, W)) -> (N, V, K)."""
    if isinstance(flat, dict):
        return {k: split_views(v, views) for k, v in flat.items()}
    return flat.reshape(-1, views, flat.shape[-1])

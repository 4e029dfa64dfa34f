"""Predictions of a distributed evaluation: accumulated per rank, gathered, de-duplicated, reported.

Predictions are accumulated per rank as (dataset index, scores, labels), gathered to every rank,
and de-duplicated by dataset index: a DistributedSampler pads the last round with repeated
samples so every rank runs the same number of batches, and those repeats must not count twice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from avion_ds.data.datasets.views import aggregate_views


class PredictionStore:
    """Accumulates per-sample scores and labels on one rank; ``gather()`` merges all ranks."""

    def __init__(self) -> None:
        self.index: list[Tensor] = []
        self.scores: list[Tensor | dict[str, Tensor]] = []
        self.labels: list[Tensor | dict[str, Tensor]] = []

    def add(self, index: Tensor, scores: Tensor | dict[str, Tensor], labels: Tensor | dict[str, Tensor]) -> None:
        def cpu(x: Any) -> Any:
            return {k: v.detach().float().cpu() for k, v in x.items()} if isinstance(x, dict) else x.detach().cpu()

        self.index.append(index.detach().cpu().long())
        self.scores.append(cpu(scores))
        self.labels.append(cpu(labels))

    @staticmethod
    def _cat(parts: list[Any]) -> Any:
        if not parts:
            return torch.empty(0)
        if isinstance(parts[0], dict):
            return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        return torch.cat(parts)

    def local(self) -> tuple[Tensor, Any, Any]:
        return self._cat(self.index), self._cat(self.scores), self._cat(self.labels)

    def gather(self) -> tuple[Tensor, Any, Any]:
        """All ranks' predictions, sorted by dataset index, with padded duplicates removed."""
        index, scores, labels = self.local()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (index, scores, labels))
            index = torch.cat([g[0] for g in gathered])
            scores = self._cat([g[1] for g in gathered])
            labels = self._cat([g[2] for g in gathered])
        return dedupe(index, scores, labels)


def _take(x: Any, sel: Tensor) -> Any:
    return {k: v[sel] for k, v in x.items()} if isinstance(x, dict) else x[sel]


def dedupe(index: Tensor, scores: Any, labels: Any) -> tuple[Tensor, Any, Any]:
    """Keep the first occurrence of each dataset index, ordered by index."""
    if index.numel() == 0:
        return index, scores, labels
    order = torch.argsort(index, stable=True)
    sorted_idx = index[order]
    keep = torch.ones_like(sorted_idx, dtype=torch.bool)
    keep[1:] = sorted_idx[1:] != sorted_idx[:-1]
    sel = order[keep]
    return index[sel], _take(scores, sel), _take(labels, sel)


def per_sample_records(index: Tensor, scores: Any, labels: Any) -> list[dict[str, Any]]:
    """JSON-able per-sample rows: index, label(s), prediction(s), and the score vector(s)."""
    rows = []
    for i in range(index.numel()):
        row: dict[str, Any] = {"index": int(index[i])}
        if isinstance(scores, dict):
            for h in scores:
                row[f"{h}_label"] = int(labels[h][i])
                row[f"{h}_pred"] = int(scores[h][i].argmax())
                row[f"{h}_scores"] = [round(float(v), 6) for v in scores[h][i]]
        else:
            row["label"] = int(labels[i])
            row["pred"] = int(scores[i].argmax())
            row["scores"] = [round(float(v), 6) for v in scores[i]]
        rows.append(row)
    return rows


def failed_in_batch(batch: dict[str, Any]) -> dict[int, str]:
    """{dataset index: reason} of the clips a batch's loader could not decode (replaced by others)."""
    idx = batch.get("failed_index")
    if idx is None:
        return {}
    reasons = batch.get("failed_reason") or [""] * len(idx)
    return {int(i): str(r) for i, r in zip(idx.tolist(), reasons) if int(i) >= 0}


def gather_failed(local: dict[int, str], dataset: Any = None) -> list[dict[str, Any]]:
    """All ranks' failed clips (padding repeats merged), sorted, named through ``dataset.row_name``."""
    merged = dict(local)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        for g in gathered:
            merged.update(g)
    name = getattr(dataset, "row_name", str)
    return [{"index": i, "name": name(i), "reason": merged[i]} for i in sorted(merged)]


def failed_line(failed: list[dict[str, Any]], show: int = 5) -> str:
    """One log line counting and naming the clips that failed to decode."""
    names = ", ".join(str(f["name"]) for f in failed[:show]) + (
        f", ... (+{len(failed) - show})" if len(failed) > show else ""
    )
    return f"{len(failed)} eval clip(s) failed to decode and are excluded from the metrics: {names}"


def aggregate_outputs(outputs: Tensor | dict[str, Tensor], views: int) -> Tensor | dict[str, Tensor]:
    """(B*V, K) logits of V views per clip -> (B, K) clip probabilities (mean softmax over views, per head).

    Also for ``views == 1`` (plain softmax), so the scores are probabilities whatever the view count.
    """

    def one(x: Tensor) -> Tensor:
        x = x.float()
        if x.shape[0] % views:
            raise ValueError(f"{x.shape[0]} outputs are not a multiple of {views} views")
        return aggregate_views(x.view(x.shape[0] // views, views, -1))

    return {k: one(v) for k, v in outputs.items()} if isinstance(outputs, dict) else one(outputs)

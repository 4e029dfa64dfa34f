"""Evaluation metrics: top-k, mean-class accuracy, EPIC verb/noun/action, distributed gathering.

Predictions are accumulated per rank as (dataset index, scores, labels), gathered to every rank,
and de-duplicated by dataset index: a DistributedSampler pads the last round with repeated
samples so every rank runs the same number of batches, and those repeats must not count twice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def topk_correct(scores: Tensor, target: Tensor, k: int) -> Tensor:
    """Bool (N,) — the true class is among the k highest scores."""
    k = min(k, scores.shape[-1])
    return (scores.topk(k, dim=-1).indices == target.view(-1, 1)).any(dim=-1)


def mean_class_accuracy(scores: Tensor, target: Tensor) -> float:
    """Mean over classes present in ``target`` of per-class top-1 recall."""
    pred = scores.argmax(dim=-1)
    classes = target.unique()
    recalls = [(pred[target == c] == c).float().mean() for c in classes]
    return float(torch.stack(recalls).mean()) if recalls else 0.0


def classification_metrics(scores: Tensor, target: Tensor, prefix: str = "") -> dict[str, float]:
    """top1 / top5 / mean_class (in percent) for one head."""
    return {
        f"{prefix}top1": 100.0 * float(topk_correct(scores, target, 1).float().mean()),
        f"{prefix}top5": 100.0 * float(topk_correct(scores, target, 5).float().mean()),
        f"{prefix}mean_class": 100.0 * mean_class_accuracy(scores, target),
    }


def action_topk_correct(verb_scores: Tensor, noun_scores: Tensor, verb: Tensor, noun: Tensor, k: int) -> Tensor:
    """Bool (N,) — (verb, noun) pair is among the top-k of p(verb) x p(noun) (top-1 = both right)."""
    pv = verb_scores.float().softmax(-1)
    pn = noun_scores.float().softmax(-1)
    joint = (pv.unsqueeze(2) * pn.unsqueeze(1)).flatten(1)  # (N, V*N)
    target = verb.long() * noun_scores.shape[-1] + noun.long()
    return topk_correct(joint, target, k)


def epic_metrics(scores: dict[str, Tensor], target: dict[str, Tensor]) -> dict[str, float]:
    """EPIC-Kitchens metrics: verb / noun top-1, top-5, mean-class and action top-1 / top-5 (percent)."""
    out: dict[str, float] = {}
    for head in ("verb", "noun"):
        out.update(classification_metrics(scores[head], target[head], prefix=f"{head}_"))
    for k in (1, 5):
        ok = action_topk_correct(scores["verb"], scores["noun"], target["verb"], target["noun"], k)
        out[f"action_top{k}"] = 100.0 * float(ok.float().mean())
    return out


def compute_metrics(scores: Tensor | dict[str, Tensor], target: Tensor | dict[str, Tensor]) -> dict[str, float]:
    """Dispatch: EPIC (verb+noun heads) metrics, per-head metrics for other dicts, or single head."""
    if isinstance(scores, dict):
        if set(scores) >= {"verb", "noun"}:
            return epic_metrics(scores, target)  # type: ignore[arg-type]
        out: dict[str, float] = {}
        for head in scores:
            out.update(classification_metrics(scores[head], target[head], prefix=f"{head}_"))  # type: ignore[index]
        return out
    return classification_metrics(scores, target)  # type: ignore[arg-type]


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


def aggregate_outputs(outputs: Tensor | dict[str, Tensor], views: int) -> Tensor | dict[str, Tensor]:
    """(B*V, K) logits of V views per clip -> (B, K) clip scores (mean softmax over views, per head)."""
    from avion_ds.data.views import aggregate_views

    def one(x: Tensor) -> Tensor:
        x = x.float()
        if x.shape[0] % views:
            raise ValueError(f"{x.shape[0]} outputs are not a multiple of {views} views")
        return aggregate_views(x.view(x.shape[0] // views, views, -1))

    return {k: one(v) for k, v in outputs.items()} if isinstance(outputs, dict) else one(outputs)

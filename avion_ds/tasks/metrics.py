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

# What every score tensor in evaluation holds (named in the eval JSON as "scores"): one
# representation end to end, so action (verb x noun) ranking is a product of probabilities.
SCORES = "probabilities: softmax per view, averaged over the temporal x spatial views"


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


def action_topk_correct(verb_probs: Tensor, noun_probs: Tensor, verb: Tensor, noun: Tensor, k: int) -> Tensor:
    """Bool (N,) — (verb, noun) pair is among the top-k of p(verb) x p(noun) (top-1 = both right).

    Takes PROBABILITIES (softmax, averaged over views for multi-view eval): ranking pairs by a
    product only means p(verb, noun) when both factors are probabilities, so logits are refused.
    """
    for name, p in (("verb", verb_probs), ("noun", noun_probs)):
        if p.numel() and (
            (p < 0).any() or not torch.allclose(p.float().sum(-1), p.new_ones(p.shape[0]).float(), atol=1e-3)
        ):
            raise ValueError(
                f"action_topk_correct: {name} scores are not probabilities (rows must be >= 0 "
                "and sum to 1); pass softmax outputs averaged over views"
            )
    joint = (verb_probs.float().unsqueeze(2) * noun_probs.float().unsqueeze(1)).flatten(1)  # (N, V*N)
    target = verb.long() * noun_probs.shape[-1] + noun.long()
    return topk_correct(joint, target, k)


def epic_metrics(scores: dict[str, Tensor], target: dict[str, Tensor]) -> dict[str, float]:
    """EPIC-Kitchens metrics: verb / noun top-1, top-5, mean-class and action top-1 / top-5 (percent).

    ``scores`` are per-head probabilities (see :data:`SCORES`).
    """
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
    from avion_ds.data.datasets.views import aggregate_views

    def one(x: Tensor) -> Tensor:
        x = x.float()
        if x.shape[0] % views:
            raise ValueError(f"{x.shape[0]} outputs are not a multiple of {views} views")
        return aggregate_views(x.view(x.shape[0] // views, views, -1))

    return {k: one(v) for k, v in outputs.items()} if isinstance(outputs, dict) else one(outputs)


# ---------------------------------------------------------------------------------------------
# EPIC-Kitchens-100 multi-instance retrieval (JPoSE's evaluation, as AVION runs it)
# ---------------------------------------------------------------------------------------------
def _mir_checked(similarity: Any, relevancy: Any) -> tuple[Any, Any]:
    """Both matrices as 2-D numpy arrays of one shape, every row AND column with a relevancy of exactly
    1 (the reference divides by the count of those: a row or column without one would be a NaN)."""
    import numpy as np

    sim, rel = np.asarray(similarity), np.asarray(relevancy)  # their own dtypes: the reference computes in them
    if sim.ndim != 2 or sim.shape != rel.shape:
        raise ValueError(f"mir_metrics: similarity {sim.shape} and relevancy {rel.shape} must be 2-D and of one shape")
    for axis, what in ((1, "row (video)"), (0, "column (sentence)")):
        empty = np.flatnonzero(~(rel == 1).any(axis=axis))
        if empty.size:
            raise ValueError(
                f"mir_metrics: relevancy {what} {int(empty[0])} has no entry equal to 1 "
                f"({empty.size} such); mAP is undefined for it"
            )
    return sim, rel


def _mean_average_precision(sim: Any, rel: Any) -> float:
    """Rows are queries. Ranked by ``(-sim).argsort()`` (numpy's default sort, as the reference, so ties
    fall the same way); precision at a hit is the summed relevancy so far over the rank; hits are
    relevancy == 1."""
    import numpy as np

    order = (-sim).argsort()
    ranked = np.take_along_axis(rel, order, axis=1)
    hits = ranked == 1
    found = np.where(hits, np.cumsum(ranked, axis=1), 0.0)
    precision = found / (np.arange(ranked.shape[1]) + 1)
    return float(np.mean(precision.sum(axis=1) / hits.sum(axis=1)))


def _dcg(sim: Any, rel: Any, k_mask: Any) -> Any:
    import numpy as np

    order = np.argsort(sim)[:, ::-1]  # the reference's ranking for nDCG (descending, ties reversed)
    gains = np.take_along_axis(rel, order, axis=1) * k_mask
    return np.sum(gains / np.log2(np.arange(sim.shape[1]) + 2), axis=1)


def _normalised_dcg(sim: Any, rel: Any) -> float:
    """nDCG over the first k ranks, k = the row's nonzero relevancies; ideal = ranking by relevancy itself."""
    import numpy as np

    k_mask = (np.sort(rel)[:, ::-1] > 0).astype(int)
    return float(np.mean(_dcg(sim, rel, k_mask) / _dcg(rel, rel, k_mask)))


def mir_metrics(similarity: Any, relevancy: Any) -> dict[str, float]:
    """EPIC-Kitchens-100 MIR metrics of a (videos x sentences) ``similarity`` against ``relevancy``:
    ``vis_*`` rank sentences per video, ``txt_*`` videos per sentence, ``avg_*`` their mean; numbers equal
    to JPoSE's / AVION's evaluation code on any input, ties included. ValueError (one line) when a row or
    column has no relevancy of exactly 1."""
    sim, rel = _mir_checked(similarity, relevancy)
    return _six(
        (_mean_average_precision(sim, rel), _normalised_dcg(sim, rel)),
        (_mean_average_precision(sim.T, rel.T), _normalised_dcg(sim.T, rel.T)),
    )


def _six(vis: tuple[float, float], txt: tuple[float, float]) -> dict[str, float]:
    """The six MIR numbers from each direction's (mAP, nDCG)."""
    return {
        "vis_map": vis[0],
        "txt_map": txt[0],
        "avg_map": (vis[0] + txt[0]) / 2,
        "vis_ndcg": vis[1],
        "txt_ndcg": txt[1],
        "avg_ndcg": (vis[1] + txt[1]) / 2,
    }


def mir_metrics_matched(similarity: Any, relevancy: Any) -> tuple[dict[str, float], dict[str, list[int]]]:
    """:func:`mir_metrics` of what can be scored after rows or columns were left out (a clip that failed
    to decode drops its row and its narration's column): a row (video) with no relevancy of exactly 1 is
    no ``vis_*`` query but stays a candidate that the ``txt_*`` queries rank, and a column (sentence)
    likewise; a direction with no query scores 0. Returns the metrics and the left-out queries
    (``{"rows": [...], "columns": [...]}``, indices). Equal to :func:`mir_metrics` when every row and
    column has an exact 1."""
    import numpy as np

    sim, rel = np.asarray(similarity), np.asarray(relevancy)
    if sim.ndim != 2 or sim.shape != rel.shape:
        raise ValueError(f"mir_metrics: similarity {sim.shape} and relevancy {rel.shape} must be 2-D and of one shape")
    exact = rel == 1
    rows, cols = np.flatnonzero(exact.any(axis=1)), np.flatnonzero(exact.any(axis=0))

    def direction(s: Any, r: Any) -> tuple[float, float]:
        if s.shape[0] == 0:
            return 0.0, 0.0
        return _mean_average_precision(s, r), _normalised_dcg(s, r)

    metrics = _six(direction(sim[rows], rel[rows]), direction(sim.T[cols], rel.T[cols]))
    left = {
        "rows": np.flatnonzero(~exact.any(axis=1)).tolist(),
        "columns": np.flatnonzero(~exact.any(axis=0)).tolist(),
    }
    return metrics, left

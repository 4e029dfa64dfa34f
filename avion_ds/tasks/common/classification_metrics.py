"""Classification metrics: top-k, mean-class accuracy, EPIC verb / noun / action (percent, torch).

The scores are the evaluation's probabilities (:data:`SCORES`), gathered from every rank by
:class:`~avion_ds.tasks.common.predictions.PredictionStore`.
"""

from __future__ import annotations

import torch
from torch import Tensor

# What every score tensor in evaluation holds (named in the eval JSON as "scores"): one
# representation end to end, so action (verb x noun) ranking is a product of probabilities.
SCORES = "probabilities: softmax per view, averaged over the temporal x spatial views"


def topk_correct(scores: Tensor, target: Tensor, k: int) -> Tensor:
    """Bool (N,) — the true class is among the k highest scores."""
    k = min(k, scores.shape[-1])
    return (scores.topk(k, dim=-1).indices == target.view(-1, 1)).any(dim=-1)


def target_classes_mean_recall(scores: Tensor, target: Tensor) -> float:
    """A fraction in [0, 1]: per-class top-1 recall averaged over the classes present in ``target`` only (a
    class that is only predicted does not enter the mean), as sklearn's ``balanced_accuracy_score``. The
    ``mean_class`` keys of classification (``verb_mean_class``, ...) are it in percent. AVION's / LaViLa's
    ``get_mean_accuracy`` averages over targets AND predictions instead:
    :func:`~avion_ds.tasks.common.action_head_metrics.confusion_mean_accuracy_percent`."""
    pred = scores.argmax(dim=-1)
    classes = target.unique()
    recalls = [(pred[target == c] == c).float().mean() for c in classes]
    return float(torch.stack(recalls).mean()) if recalls else 0.0


def classification_metrics(scores: Tensor, target: Tensor, prefix: str = "") -> dict[str, float]:
    """top1 / top5 / mean_class (in percent) for one head."""
    return {
        f"{prefix}top1": 100.0 * float(topk_correct(scores, target, 1).float().mean()),
        f"{prefix}top5": 100.0 * float(topk_correct(scores, target, 5).float().mean()),
        f"{prefix}mean_class": 100.0 * target_classes_mean_recall(scores, target),
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

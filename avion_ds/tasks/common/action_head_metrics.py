"""EPIC-Kitchens-100 metrics of ONE action head (``epic.label: action``), two ways.

AVION's (``scripts/main_lavila_finetune_cls.py`` ``validate``, ``avion/utils/evaluation_ek100cls.py``), keys
prefixed ``avion_``:

- ``avion_action_top1`` / ``avion_action_top5``: sklearn's ``top_k_accuracy_score`` with ``labels=arange(C)``
  (classes ranked by a stable ascending argsort, reversed: of tied scores the higher id ranks first);
  AVION prints it as a fraction, here in percent like every other key;
- ``avion_action_mean_class``: ``get_mean_accuracy`` of sklearn's ``confusion_matrix(targets, argmax)``
  WITHOUT ``labels=``: its classes are the sorted union of targets and predictions, and a class that is
  only predicted counts 0 in the mean;
- ``avion_verb_top1`` / ``avion_noun_top1``: the overall accuracy (``trace / sum``) of the argmax of the
  marginal scores, ``marginalize(probs, get_marginal_indexes(actions, mode))``: a verb's score sums the
  probabilities of its actions, and a verb no action has takes action 0's probability (AVION's stand-in).

The evaluation's usual EPIC keys (``verb_top1/top5/mean_class``, ``noun_*``, ``action_top1/top5``) come
from the same probabilities: actions directly, verbs and nouns from the marginal p(verb) = sum of p(action)
over its actions (0 for a verb no action has), with :func:`~avion_ds.tasks.common.classification_metrics.classification_metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from avion_ds.tasks.common.classification_metrics import classification_metrics, topk_correct

AVION_KEYS = (
    "avion_action_top1",
    "avion_action_top5",
    "avion_action_mean_class",
    "avion_verb_top1",
    "avion_noun_top1",
)


def marginal_indexes(classes: Sequence[int]) -> list[np.ndarray]:
    """For each class ``c`` in 0..max(classes): the action ids whose class is ``c``, or ``[0]`` when none
    (AVION's ``get_marginal_indexes``; ``classes[i]`` is action ``i``'s verb or noun)."""
    classes = np.asarray(classes)
    out = []
    for c in range(int(classes.max()) + 1):
        ids = np.flatnonzero(classes == c)
        out.append(ids if ids.size else np.array([0]))
    return out


def marginalize(probs: np.ndarray, indexes: list[np.ndarray]) -> np.ndarray:
    """(N, A) action probabilities -> (N, len(indexes)): column ``c`` sums the actions ``indexes[c]``."""
    if not indexes:
        return np.zeros((probs.shape[0], 0), dtype=probs.dtype)
    return np.stack([probs[:, ids].sum(1) for ids in indexes], axis=1)


def confusion_mean_accuracy_percent(target: np.ndarray, pred: np.ndarray) -> float:
    """Percent: per-class recall averaged over the classes in ``target`` OR ``pred`` (0 for a class no target
    has): ``get_mean_accuracy`` of sklearn's ``confusion_matrix(target, pred)`` without building the matrix
    (AVION's EK100 CLS ``validate``, LaViLa's zero-shot EGTEA). Classification's ``mean_class`` keys average
    over the target classes alone: :func:`~avion_ds.tasks.common.classification_metrics.target_classes_mean_recall`."""
    classes = np.union1d(target, pred)
    if classes.size == 0:
        return 0.0
    t = np.searchsorted(classes, target)
    rows = np.bincount(t, minlength=classes.size)
    right = np.bincount(t[target == pred], minlength=classes.size)
    recall = np.divide(right, rows, out=np.zeros(classes.size), where=rows > 0)
    return float(100 * np.mean(recall))


def topk_accuracy(target: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Percent of rows whose target is among the ``k`` best scores, ranked as sklearn's ``top_k_accuracy_score``
    (stable ascending argsort, reversed)."""
    if target.size == 0:
        return 0.0
    ranked = np.argsort(scores, axis=1, kind="mergesort")[:, ::-1][:, :k]
    return float(100 * np.average((ranked == target[:, None]).any(axis=1)))


def overall_accuracy(target: np.ndarray, pred: np.ndarray) -> float:
    """Percent right: ``get_mean_accuracy``'s ``100 * trace(cm) / sum(cm)``."""
    return float(100 * int(np.sum(target == pred)) / target.size) if target.size else 0.0


def avion_metrics(
    probs: np.ndarray, target: np.ndarray, verbs: Sequence[int], nouns: Sequence[int]
) -> dict[str, float]:
    """AVION's CLS numbers (module doc) of (N, A) action probabilities ``probs`` against action ids ``target``;
    ``verbs[i]`` / ``nouns[i]``: action ``i``'s classes (the label map)."""
    target = np.asarray(target, dtype=np.int64)
    out = {
        "avion_action_top1": topk_accuracy(target, probs, 1),
        "avion_action_top5": topk_accuracy(target, probs, 5),
        "avion_action_mean_class": confusion_mean_accuracy_percent(target, probs.argmax(axis=1)),
    }
    for name, classes in (("verb", np.asarray(verbs)), ("noun", np.asarray(nouns))):
        scores = marginalize(probs, marginal_indexes(classes))
        out[f"avion_{name}_top1"] = overall_accuracy(classes[target], scores.argmax(axis=1))
    return out


def summed_marginal(probs: Tensor, classes: Sequence[int]) -> Tensor:
    """(N, A) -> (N, max(classes) + 1): p(class) = the sum of its actions' probabilities (0 when none)."""
    idx = torch.as_tensor(list(classes), dtype=torch.long)
    out = probs.new_zeros(probs.shape[0], int(idx.max()) + 1)
    return out.index_add_(1, idx, probs)


def action_head_metrics(probs: Tensor, target: Tensor, action_map: Any) -> dict[str, float]:
    """The usual EPIC keys and AVION's (module doc) of (N, A) action probabilities against action ids;
    ``action_map``: :class:`~avion_ds.data.datasets.epic_actions.ActionMap` (``verbs``, ``nouns``)."""
    probs, target = probs.float().cpu(), target.long().cpu()
    out: dict[str, float] = {}
    for name, classes in (("verb", action_map.verbs), ("noun", action_map.nouns)):
        of_target = torch.as_tensor(list(classes), dtype=torch.long)[target]
        out.update(classification_metrics(summed_marginal(probs, classes), of_target, prefix=f"{name}_"))
    for k in (1, 5):
        out[f"action_top{k}"] = 100.0 * float(topk_correct(probs, target, k).float().mean()) if len(target) else 0.0
    out.update(avion_metrics(probs.numpy(), target.numpy(), action_map.verbs, action_map.nouns))
    return out

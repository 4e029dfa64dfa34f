"""Zero-shot top-1 / top-5 / mean class accuracy on tied scores: both ranks come from ONE ordering, the one of
LaViLa's ``accuracy`` (lavila/utils/evaluation.py: ``output.topk(maxk, 1, True, True)``), re-implemented here as
the reference; a top-1 hit is always a top-5 hit."""

from __future__ import annotations

import pytest
import torch

from avion_ds.tasks.common.action_head_metrics import confusion_mean_accuracy_percent
from avion_ds.tasks.zero_shot.benchmarks import head_accuracies, ranked_classes


def ref_accuracy(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1,)) -> list[float]:
    """LaViLa's ``accuracy`` (percent per k)."""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.reshape(1, -1).expand_as(pred))
        return [float(correct[:k].reshape(-1).float().sum(0) * 100.0 / batch_size) for k in topk]


def _tied(seed: int, rows: int, classes: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (rows, classes), generator=g).float() / levels if levels else None
    if scores is None:
        scores = torch.zeros(rows, classes)
    return scores, torch.randint(0, classes, (rows,), generator=g)


@pytest.mark.parametrize(("seed", "classes", "levels"), [(0, 10, 0), (1, 10, 2), (2, 106, 3), (3, 300, 0), (4, 7, 2)])
def test_tied_scores_rank_top1_and_top5_from_one_ordering(seed: int, classes: int, levels: int) -> None:
    scores, target = _tied(seed, 64, classes, levels)
    ranked = ranked_classes(scores, 5)
    top1_hit = ranked[:, 0] == target
    top5_hit = (ranked == target[:, None]).any(dim=1)
    assert bool((top5_hit | ~top1_hit).all()), "a top-1 hit outside the top-5"
    m = head_accuracies({"h": scores}, {"h": target}, prefix=False)
    ref1, ref5 = ref_accuracy(scores, target, (1, 5))
    assert (m["top1"], m["top5"]) == (pytest.approx(ref1), pytest.approx(ref5))
    pred = scores.topk(5, 1, True, True).indices[:, 0]
    assert m["mean_class"] == pytest.approx(confusion_mean_accuracy_percent(target.numpy(), pred.numpy()))


def test_all_zero_scores_top1_hits_are_top5_hits() -> None:
    """All-zero rows: argmax (class 0) and a reversed stable argsort (classes 9..5) would put the top-1 hits
    and the top-5 hits on disjoint rows."""
    scores = torch.zeros(10, 10)
    target = torch.arange(10)
    m = head_accuracies({"h": scores}, {"h": target}, prefix=False)
    ref1, ref5 = ref_accuracy(scores, target, (1, 5))
    assert m["top1"] == pytest.approx(ref1) == 10.0 and m["top5"] == pytest.approx(ref5) == 50.0
    ranked = ranked_classes(scores, 5)
    assert bool(((ranked == target[:, None]).any(1) | (ranked[:, 0] != target)).all())


def test_fewer_classes_than_k_and_untied_scores_unchanged() -> None:
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
    m = head_accuracies({"egtea": scores}, {"egtea": torch.tensor([0, 1, 1])}, prefix=False)
    assert m["top1"] == pytest.approx(200 / 3) and m["top5"] == 100.0 and m["mean_class"] == pytest.approx(75.0)

"""Metrics on hand-made predictions: top-k, mean class, EPIC action, multi-view, padded gathering."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from avion_ds.tasks.common.action_head_metrics import confusion_mean_accuracy_percent
from avion_ds.tasks.common.classification_metrics import (
    action_topk_correct,
    compute_metrics,
    target_classes_mean_recall,
)
from avion_ds.tasks.common.predictions import PredictionStore, aggregate_outputs, dedupe, per_sample_records
from tests.helpers import free_port


def _onehot_scores(preds: list[int], k: int) -> torch.Tensor:
    s = torch.zeros(len(preds), k)
    s[torch.arange(len(preds)), torch.tensor(preds)] = 1.0
    return s


def test_top1_top5_mean_class() -> None:
    target = torch.tensor([0, 0, 0, 1])
    scores = _onehot_scores([0, 0, 0, 0], 6)  # 3/4 right, class 1 never right
    m = compute_metrics(scores, target)
    assert m["top1"] == pytest.approx(75.0)
    assert m["mean_class"] == pytest.approx(50.0)  # (3/3 + 0/1) / 2
    ranked = torch.tensor([[6.0, 5, 4, 3, 2, 1]])
    assert compute_metrics(ranked, torch.tensor([5]))["top5"] == 0.0
    assert compute_metrics(ranked, torch.tensor([4]))["top5"] == 100.0
    assert target_classes_mean_recall(scores, target) == pytest.approx(0.5)


def test_the_two_mean_class_accuracies_differ_on_a_class_only_predicted() -> None:
    """Classification's ``mean_class`` averages over the target classes (a fraction; sklearn's balanced
    accuracy); AVION's / LaViLa's ``get_mean_accuracy`` over targets and predictions (percent)."""
    target, pred = [0, 0, 1, 1], [0, 0, 1, 5]  # class 5 is only predicted
    fraction = target_classes_mean_recall(_onehot_scores(pred, 6), torch.tensor(target))
    assert fraction == pytest.approx((1.0 + 0.5) / 2)  # classes {0, 1}
    assert confusion_mean_accuracy_percent(np.array(target), np.array(pred)) == pytest.approx(
        100 * (1.0 + 0.5 + 0.0) / 3  # classes {0, 1, 5}
    )


def test_epic_action_needs_both_right() -> None:
    verb = torch.tensor([0, 1, 2, 0])
    noun = torch.tensor([1, 1, 0, 2])
    scores = {
        "verb": (_onehot_scores([0, 1, 0, 0], 3) * 5).softmax(-1),  # probabilities, as evaluate_model gives
        "noun": (_onehot_scores([1, 0, 0, 2], 3) * 5).softmax(-1),
    }
    m = compute_metrics(scores, {"verb": verb, "noun": noun})
    assert m["verb_top1"] == pytest.approx(75.0)  # samples 0, 1, 3
    assert m["noun_top1"] == pytest.approx(75.0)  # samples 0, 2, 3
    assert m["action_top1"] == pytest.approx(50.0)  # samples 0 and 3 only
    assert m["action_top5"] >= m["action_top1"]
    ok = action_topk_correct(scores["verb"], scores["noun"], verb, noun, 9)
    assert bool(ok.all())  # 9 = all pairs of a 3 x 3 action space


def test_multi_view_aggregation_mean_softmax() -> None:
    # 2 clips x 3 views; clip 0: two weak votes for class 1, one strong for class 0
    flat = torch.tensor([[0.0, 1.0], [0.0, 1.0], [10.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0]])
    agg = aggregate_outputs(flat, views=3)
    assert agg.shape == (2, 2)
    assert agg[0].argmax() == 0  # mean softmax, not majority vote
    assert torch.allclose(agg.sum(-1), torch.ones(2))
    heads = aggregate_outputs({"verb": flat, "noun": flat}, views=3)
    assert torch.equal(heads["verb"], agg)
    with pytest.raises(ValueError, match="not a multiple of 4 views"):
        aggregate_outputs(flat, views=4)


def test_dedupe_removes_padded_repeats() -> None:
    index = torch.tensor([3, 0, 1, 2, 0])  # sampler padded with index 0
    scores = torch.arange(10.0).view(5, 2)
    labels = torch.tensor([1, 0, 1, 0, 0])
    i, s, y = dedupe(index, scores, labels)
    assert i.tolist() == [0, 1, 2, 3]
    assert s[0].tolist() == [2.0, 3.0] and y.tolist() == [0, 1, 0, 1]
    rows = per_sample_records(i, s, y)
    assert rows[3] == {"index": 3, "label": 1, "pred": 1, "scores": [0.0, 1.0]}


def _gather_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    # 5 samples over 2 ranks: a DistributedSampler gives rank 0 [0, 2, 4] and rank 1 [1, 3, 0] (padded)
    mine = [0, 2, 4] if rank == 0 else [1, 3, 0]
    store = PredictionStore()
    idx = torch.tensor(mine)
    store.add(
        idx,
        {"verb": _onehot_scores([i % 2 for i in mine], 2), "noun": _onehot_scores([0] * 3, 2)},
        {"verb": idx % 2, "noun": torch.zeros(3, dtype=torch.long)},
    )
    index, scores, labels = store.gather()
    out[rank] = (index.tolist(), compute_metrics(scores, labels)["action_top1"])
    torch.distributed.destroy_process_group()


def test_distributed_gather_two_ranks() -> None:
    port = free_port()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gather_worker, args=(port, out), nprocs=2, join=True)
        result = dict(out)
    assert result[0] == result[1] == ([0, 1, 2, 3, 4], 100.0)

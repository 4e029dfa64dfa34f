"""Evaluation end to end: multi-view EPIC action top-k against brute force, and clips that fail to decode
are counted and named instead of vanishing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from avion_ds.tasks.base import EvalContext
from avion_ds.tasks.common.classification_metrics import action_topk_correct
from avion_ds.tasks.common.evaluation import evaluate_model

KV, KN = 5, 7


class _LogitModel(torch.nn.Module):
    """Returns its input as logits: x (B*V, KV+KN) -> {"verb": x[:, :KV], "noun": x[:, KV:]}."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"verb": x[:, :KV], "noun": x[:, KV:]}


def _brute_force_action(logits: torch.Tensor, verb: torch.Tensor, noun: torch.Tensor, k: int) -> float:
    """Percent of clips whose (verb, noun) is among the k most probable pairs, one pair at a time.

    logits: (N, V, KV+KN). p(verb, noun) = mean-over-views softmax(verb) x mean-over-views softmax(noun).
    """
    hits = 0
    for i in range(logits.shape[0]):
        pv = torch.stack([torch.softmax(logits[i, v, :KV].double(), 0) for v in range(logits.shape[1])]).mean(0)
        pn = torch.stack([torch.softmax(logits[i, v, KV:].double(), 0) for v in range(logits.shape[1])]).mean(0)
        pairs = [(float(pv[a] * pn[b]), a, b) for a in range(KV) for b in range(KN)]
        mine = float(pv[verb[i]] * pn[noun[i]])
        better = sum(1 for s, _, _ in pairs if s > mine)
        hits += better < k
    return 100.0 * hits / logits.shape[0]


@pytest.mark.parametrize("views", [6, 1])
def test_multiview_action_topk_matches_brute_force(views: int) -> None:
    g = torch.Generator().manual_seed(0)
    n = 120
    logits = torch.randn(n, views, KV + KN, generator=g) * 2.5
    # real actions: labels drawn near the top of the ranking so top-1 / top-5 are neither 0 nor 100
    verb = torch.randint(0, 2, (n,), generator=g)
    noun = torch.randint(0, 3, (n,), generator=g)
    order = logits.mean(1)
    verb = order[:, :KV].argsort(-1, descending=True)[torch.arange(n), verb]
    noun = order[:, KV:].argsort(-1, descending=True)[torch.arange(n), noun]
    batches = [
        {
            "frames": logits[i : i + 8].reshape(-1, KV + KN),
            "index": torch.arange(i, min(i + 8, n)),
            "label": {"verb": verb[i : i + 8], "noun": noun[i : i + 8]},
        }
        for i in range(0, n, 8)
    ]

    class Loader(list):
        dataset = None

    ctx = EvalContext(_LogitModel(), Loader(batches), lambda x, y: (x, y), torch.device("cpu"), None, views)
    metrics, (index, scores, _labels), failed = evaluate_model(ctx)
    assert failed == [] and index.tolist() == list(range(n))
    for head in ("verb", "noun"):  # one representation: probabilities
        torch.testing.assert_close(scores[head].sum(-1), torch.ones(n))
    for k in (1, 5):
        assert metrics[f"action_top{k}"] == pytest.approx(_brute_force_action(logits, verb, noun, k)), k
    assert 0 < metrics["action_top5"] < 100


def test_action_topk_refuses_logits() -> None:
    logits = torch.randn(4, KV)
    with pytest.raises(ValueError, match="not probabilities"):
        action_topk_correct(logits, torch.randn(4, KN).softmax(-1), torch.zeros(4), torch.zeros(4), 5)


def test_failed_val_clips_are_counted_and_named(tiny_epic: dict, tmp_path: Path) -> None:
    """One val video's chunks are emptied: its clips are listed by narration id, the rest evaluated."""
    import csv

    from avion_ds.config import DataConfig
    from avion_ds.data import DeviceAugment, build_dataset, build_loader
    from avion_ds.models import create_model

    chunks = tmp_path / "chunks"
    shutil.copytree(tiny_epic["root"], chunks)
    with open(tiny_epic["val_csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    victim = rows[0]["video_id"]
    for p in (chunks / victim).glob("*.mp4"):
        p.write_bytes(b"")
    expected = sorted(r["narration_id"] for r in rows if r["video_id"] == victim)
    cfg = DataConfig(
        dataset="epic",
        root=str(chunks),
        train_csv=str(tiny_epic["train_csv"]),
        val_csv=str(tiny_epic["val_csv"]),
        num_frames=4,
        size=32,
        workers=0,
        decode_timeout_s=0.0,
    )
    ds = build_dataset(cfg, "val", temporal_views=2, spatial_views=1)
    loader = build_loader(ds, 3, 0, shuffle=False, seed=0, drop_last=False, distributed=False)
    model = create_model("vit_test_tiny", heads={"verb": 4, "noun": 3}).eval()
    augment = DeviceAugment(cfg, {"verb": 4, "noun": 3}, False)
    metrics, (index, _, _), failed = evaluate_model(EvalContext(model, loader, augment, torch.device("cpu"), None, 2))
    assert sorted(f["name"] for f in failed) == expected
    assert all("zero-byte file" in f["reason"] for f in failed)
    assert index.numel() == len(rows) - len(expected)  # the rest is evaluated, each clip once
    assert not set(index.tolist()) & {f["index"] for f in failed}
    assert "action_top1" in metrics

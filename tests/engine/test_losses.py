"""Losses: label-smoothed CE, soft-target CE (mixup), EPIC verb + noun sum."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from avion_ds.tasks.finetune.losses import classification_loss, total_loss


def test_label_smoothing_matches_soft_targets() -> None:
    torch.manual_seed(0)
    logits, y = torch.randn(6, 5), torch.randint(0, 5, (6,))
    soft = F.one_hot(y, 5).float() * 0.9 + 0.1 / 5
    assert classification_loss(logits, y, 0.1) == pytest.approx(float(classification_loss(logits, soft)), rel=1e-6)
    assert classification_loss(logits, y) == pytest.approx(float(F.cross_entropy(logits, y)))


def test_epic_loss_is_sum_of_heads() -> None:
    torch.manual_seed(0)
    out = {"verb": torch.randn(4, 3), "noun": torch.randn(4, 7)}
    tgt = {"verb": torch.randint(0, 3, (4,)), "noun": torch.randint(0, 7, (4,))}
    loss, parts = total_loss(out, tgt, 0.0)
    ref = F.cross_entropy(out["verb"], tgt["verb"]) + F.cross_entropy(out["noun"], tgt["noun"])
    assert float(loss) == pytest.approx(float(ref))
    assert set(parts) == {"verb", "noun"}


def test_head_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="do not match target heads"):
        total_loss({"verb": torch.randn(2, 3)}, {"noun": torch.zeros(2, dtype=torch.long)})
    with pytest.raises(ValueError, match="soft targets"):
        classification_loss(torch.randn(2, 3), torch.rand(2, 4))

"""Parameter groups (no-decay, layer-wise lr decay) and the warmup + cosine schedule."""

from __future__ import annotations

import math

import pytest
import torch

from avion_ds.engine.optim import client_adamw, param_groups
from avion_ds.engine.schedule import WarmupCosine, cosine_lr
from avion_ds.models import create_model


def test_no_decay_for_norms_biases_and_embeddings() -> None:
    model = create_model("vit_test_tiny", num_classes=5, pos_embed="learned")
    groups = param_groups(model, weight_decay=0.05, layer_decay=0.75)
    decay_of = {n: g["weight_decay"] for g in groups for n in g["names"]}
    assert set(decay_of) == {n for n, p in model.named_parameters() if p.requires_grad}
    for name, p in model.named_parameters():
        expect_none = p.ndim <= 1 or name in model.no_weight_decay()
        assert (decay_of[name] == 0.0) == expect_none, name
    assert any(v == 0.05 for v in decay_of.values())
    assert any("pos_embed" in n and decay_of[n] == 0.0 for n in decay_of)


def test_layer_decay_scales_follow_layer_id() -> None:
    model = create_model("vit_test_tiny", num_classes=5)
    depth = model.depth
    groups = param_groups(model, weight_decay=0.05, layer_decay=0.5)
    for g in groups:
        for n in g["names"]:
            assert g["lr_scale"] == pytest.approx(0.5 ** (depth + 1 - model.layer_id(n))), n
    scales = {g["lr_scale"] for g in groups}
    assert max(scales) == 1.0 and min(scales) == pytest.approx(0.5 ** (depth + 1))
    flat = param_groups(model, weight_decay=0.05, layer_decay=1.0)
    assert {g["lr_scale"] for g in flat} == {1.0} and len(flat) == 2


def test_cosine_with_warmup() -> None:
    assert cosine_lr(0, 1.0, 0.0, 4, 20) == pytest.approx(0.25)
    assert cosine_lr(3, 1.0, 0.0, 4, 20) == pytest.approx(1.0)
    assert cosine_lr(4, 1.0, 0.1, 4, 20) == pytest.approx(1.0)
    assert cosine_lr(12, 1.0, 0.1, 4, 20) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert cosine_lr(20, 1.0, 0.1, 4, 20) == pytest.approx(0.1)
    assert cosine_lr(99, 1.0, 0.1, 4, 20) == pytest.approx(0.1)


def test_scheduler_honours_lr_scale_and_state_round_trip() -> None:
    model = create_model("vit_test_tiny", num_classes=5)
    groups = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(model, 0.05, 0.5)]
    from avion_ds.tasks import load_recipe

    opt = client_adamw(groups, load_recipe(None, ["data.dataset=kinetics"]), lr=1.0)
    sched = WarmupCosine(opt, base_lr=1.0, min_lr=0.0, warmup_steps=2, total_steps=10)
    for _ in range(5):
        sched.step()
    base = cosine_lr(5, 1.0, 0.0, 2, 10)
    for g in opt.param_groups:
        assert g["lr"] == pytest.approx(base * g["lr_scale"])
    # a resumed run: fresh optimizer + scheduler (at step 0), then the saved state; it must continue at step 5
    groups2 = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(model, 0.05, 0.5)]
    opt2 = client_adamw(groups2, load_recipe(None, ["data.dataset=kinetics"]), lr=1.0)
    other = WarmupCosine(opt2, base_lr=1.0, min_lr=0.0, warmup_steps=2, total_steps=10)
    assert other.get_last_lr() != sched.get_last_lr()  # step 0 (warmup) vs step 5
    other.load_state_dict(sched.state_dict())
    assert other.last_step == 5
    assert other.get_last_lr() == pytest.approx(sched.get_last_lr())
    for g in opt2.param_groups:
        assert g["lr"] == pytest.approx(base * g["lr_scale"])
    other.step()
    sched.step()
    assert other.get_last_lr() == pytest.approx(sched.get_last_lr())
    assert isinstance(opt, torch.optim.AdamW)

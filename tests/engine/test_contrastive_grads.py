"""AVION's contrastive loss and the feature-cache accumulation: the gradient of a window equals the gradient
of ONE batch of all its clips, across ranks (2 gloo ranks, ZeRO 0-3, through ``Trainer.train_step``) and
across micro-batches (micro x accum vs one batch), with dropout and drop path off.

The same for MIR fine-tuning's max-margin loss (``task: mir``). The 2-rank cases share one launch
(``grad_runs``). The reference is AVION's ``ClipLoss`` written out in the test (one process: ``scale * I T^T`` and
``scale * T I^T``, symmetric cross-entropy, ``clip_acc`` from argmax of the image logits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from avion_ds.tasks.contrastive.losses import clip_loss, feature_cache_losses
from tests.helpers import launch

SCRIPT = Path(__file__).with_name("clip_grad_script.py")


def avion_clip_loss(image_features, text_features, logit_scale):
    """``avion/losses/losses.py`` ClipLoss.forward with world_size 1 (MIT licence)."""
    logits_per_image = logit_scale * image_features @ text_features.T
    logits_per_text = logit_scale * text_features @ image_features.T
    labels = torch.arange(logits_per_image.shape[0], dtype=torch.long)
    total_loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
    with torch.no_grad():
        pred = torch.argmax(logits_per_image, dim=-1)
        correct = pred.eq(labels).sum()
        acc = 100 * correct / logits_per_image.size(0)
    return {"loss": total_loss, "clip_acc": acc}


def test_clip_loss_is_avions_including_ties() -> None:
    g = torch.Generator().manual_seed(0)
    v = F.normalize(torch.randn(9, 8, generator=g), dim=-1)
    t = F.normalize(torch.randn(9, 8, generator=g), dim=-1)
    v[3], t[5] = v[2], t[2]  # tied rows and columns: argmax takes the first, in both
    t[7] = v[7]
    scale = torch.tensor(1 / 0.07)
    loss, parts = clip_loss(v, t, scale)
    ref = avion_clip_loss(v, t, scale)
    assert abs(float(loss) - float(ref["loss"])) < 1e-6
    assert float(parts["clip_acc"]) == pytest.approx(float(ref["clip_acc"]))
    sim = v @ t.T  # text -> video: argmax over the videos of each text (first on ties)
    t2v = 100 * float((sim.T.argmax(dim=-1) == torch.arange(9)).float().mean())
    assert float(parts["t2v_acc"]) == pytest.approx(t2v)
    assert float(parts["logit_scale"]) == pytest.approx(1 / 0.07)


def _tiny_dual_encoder() -> torch.nn.Module:
    from avion_ds.models import create_model

    torch.manual_seed(0)
    return create_model("clip_vit_test_tiny", drop_path_rate=0.0).double().train()


@pytest.mark.parametrize("frozen_scale", [False, True])
def test_feature_cache_equals_one_batch(frozen_scale: bool) -> None:
    """3 micro-batches of 2 through the cache give the gradient of one batch of 6 (float64: exact to
    rounding), the temperature's included once."""
    from avion_ds.data.tokenizer import tokenize

    model = _tiny_dual_encoder()
    model.logit_scale.requires_grad_(not frozen_scale)
    g = torch.Generator().manual_seed(1)
    frames = torch.randn(6, 3, 2, 32, 32, generator=g, dtype=torch.float64)
    tokens = tokenize([f"#C C takes object {i}" for i in range(6)])
    out = model(frames, tokens)
    ref = avion_clip_loss(out.video, out.text, out.logit_scale)["loss"]
    ref.backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    def encode(i: int):
        o = model(frames[2 * i : 2 * i + 2], tokens[2 * i : 2 * i + 2])
        return o.video, o.text, o.logit_scale

    losses = []
    for loss, _ in feature_cache_losses(encode, 3):
        loss.backward()  # unscaled: the three backwards sum to the window's gradient
        losses.append(float(loss))
    assert all(abs(x - float(ref)) < 1e-9 for x in losses)
    got = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    assert ("logit_scale" in got) != frozen_scale
    for k, want in expected.items():
        assert float((got[k] - want).abs().max()) < 1e-6, k


def test_feature_cache_replays_dropout() -> None:
    """With drop path on, the recomputed micro-batch sees the same random draws as its cached copy."""
    from avion_ds.data.tokenizer import tokenize
    from avion_ds.models import create_model

    torch.manual_seed(0)
    model = create_model("clip_vit_test_tiny", drop_path_rate=0.5).double().train()
    frames = torch.randn(4, 3, 2, 32, 32, dtype=torch.float64)
    tokens = tokenize(["a", "b", "c", "d"])
    seen: dict[int, list[torch.Tensor]] = {0: [], 1: []}

    def encode(i: int):
        o = model(frames[2 * i : 2 * i + 2], tokens[2 * i : 2 * i + 2])
        seen[i].append(o.video.detach().clone())
        return o.video, o.text, o.logit_scale

    for loss, _ in feature_cache_losses(encode, 2):
        loss.backward()
    for i in (0, 1):
        assert torch.equal(seen[i][0], seen[i][1])


# every 2-rank case of this module in ONE launch (the ranks start once): name -> stages, task, accum, options
CASES = [
    {"name": "accum", "stages": [0, 1, 2, 3], "accum": 2, "ckpt": True},
    {"name": "frozen", "stages": [0, 3], "accum": 1, "freeze": "freeze_visual,freeze_temperature"},
    {"name": "bf16", "stages": [2, 3], "accum": 2, "precision": "bf16"},
    {"name": "mir", "stages": [0, 2], "accum": 2, "task": "mir"},
]


@pytest.fixture(scope="module")
def grad_runs() -> dict[str, dict[int, dict]]:
    """``clip_grad_script.py`` on 2 ranks for every case of ``CASES``: {case: {stage: its RESULT}}."""
    proc = launch([json.dumps(CASES)], launcher="torchrun", script_path=SCRIPT, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    out: dict[str, dict[int, dict]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            out.setdefault(r["case"], {})[r["stage"]] = r
    got = {c["name"]: sorted(out.get(c["name"], {})) for c in CASES}
    assert got == {c["name"]: c["stages"] for c in CASES}, log[-3000:]
    return out


@pytest.mark.multiprocess
def test_two_ranks_and_accumulation_match_one_process(grad_runs: dict[str, dict[int, dict]]) -> None:
    """2 ranks x 2 micro-batches of 2 (ZeRO 0, 1, 2, 3; activation checkpointing on both towers): the logged
    loss and the applied gradient of every parameter equal one process's on the 8 clips (1e-6, relative to
    the tensor's largest gradient)."""
    for stage, r in grad_runs["accum"].items():
        assert abs(r["loss"] - r["ref_loss"]) < 1e-6, (stage, r["loss"], r["ref_loss"])
        bad = {k: e for k, e in r["errors"].items() if e > 1e-6}
        assert not bad, (stage, bad)
        assert len(r["changed"]) == len(r["errors"]), stage  # every parameter got its update


@pytest.mark.multiprocess
def test_frozen_tower_and_temperature_stay_put(grad_runs: dict[str, dict[int, dict]]) -> None:
    for stage, r in grad_runs["frozen"].items():
        assert r["changed"], stage
        assert all(k.startswith("textual.") for k in r["changed"]), (stage, r["changed"])
        assert not {k: e for k, e in r["errors"].items() if k.startswith("textual.") and e > 1e-5}, stage


@pytest.mark.multiprocess
def test_bf16_step_follows_the_fp32_reference(grad_runs: dict[str, dict[int, dict]]) -> None:
    """bf16 (the recipes' precision; AVION uses fp16 autocast) on ZeRO-2 and ZeRO-3 (both towers partitioned):
    the loss within 0.05 of one fp32 process's and the applied update pointing along its gradient."""
    for stage, r in grad_runs["bf16"].items():
        assert abs(r["loss"] - r["ref_loss"]) < 0.05, (stage, r["loss"], r["ref_loss"])
        assert r["cosine"] > 0.999, (stage, r["cosine"])


@pytest.mark.multiprocess
def test_mir_two_ranks_and_accumulation_match_one_process(grad_runs: dict[str, dict[int, dict]]) -> None:
    """MIR fine-tuning (``task: mir``, AVION's max-margin loss; its oracle and the task's other tests:
    ``test_mir_finetune.py``), 2 ranks x 2 micro-batches of 2 (ZeRO 0 and 2, through ``Trainer.train_step``):
    the logged loss and the applied gradient of every parameter equal one process's AVION loss on the 8 clips;
    the temperature stays put."""
    for stage, r in grad_runs["mir"].items():
        assert abs(r["loss"] - r["ref_loss"]) < 1e-6, stage
        assert not {k: e for k, e in r["errors"].items() if e > 1e-6}, stage
        assert set(r["errors"]) - set(r["changed"]) == {"logit_scale"}, stage

"""EPIC-100 MIR fine-tuning (``task: mir``): AVION's ``MaxMarginRankingLoss`` (the class copied below as the
oracle), its feature-cache gradients against one process on the whole batch (the 2-rank case:
``test_contrastive_grads.py``), the task's defaults and refusals, and the shipped recipes' values (AVION
``scripts/main_lavila_finetune_mir.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.tasks import load_recipe, task_of
from avion_ds.tasks.contrastive.losses import feature_cache_losses
from avion_ds.tasks.mir.losses import max_margin_loss

REPO = Path(__file__).resolve().parents[2]
MIR_FILES = ["epic_mir.train_sentences=s.csv", "epic_mir.train_relevancy=r.pkl"]


# ---- the oracle: avion/losses/losses.py (zhaoyue-zephyrus/AVION @ 31b00b6, MIT licence), one process
def gather_features(image_features, text_features, *args):
    return image_features, text_features  # world_size 1: AVION's all_gather returns the rank's own rows


def sim_matrix(a, b, eps=1e-8):
    a_n, b_n = a.norm(dim=1)[:, None], b.norm(dim=1)[:, None]
    a_norm = a / torch.max(a_n, eps * torch.ones_like(a_n))
    b_norm = b / torch.max(b_n, eps * torch.ones_like(b_n))
    sim_mt = torch.mm(a_norm, b_norm.transpose(0, 1))
    return sim_mt


class MaxMarginRankingLoss(nn.Module):
    def __init__(
        self,
        margin=0.2,
        fix_norm=True,
        local_loss=False,
        gather_with_grad=False,
        rank=0,
        world_size=1,
        use_horovod=False,
    ):
        super().__init__()
        self.fix_norm = fix_norm
        self.margin = margin
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.rank = rank
        self.world_size = world_size
        self.use_horovod = use_horovod

    def forward(self, image_features, text_features, weight=None):
        all_image_features, all_text_features = gather_features(
            image_features,
            text_features,
            self.local_loss,
            self.gather_with_grad,
            self.rank,
            self.world_size,
            self.use_horovod,
        )
        x = sim_matrix(all_text_features, all_image_features)
        n = x.size()[0]
        x1 = torch.diag(x)
        x1 = x1.unsqueeze(1)
        x1 = x1.expand(n, n)
        x1 = x1.contiguous().view(-1, 1)
        x1 = torch.cat((x1, x1), 0)
        x2 = x.view(-1, 1)
        x3 = x.transpose(0, 1).contiguous().view(-1, 1)
        x2 = torch.cat((x2, x3), 0)
        max_margin = F.relu(self.margin - (x1 - x2))
        if self.fix_norm:
            keep = torch.ones(x.shape) - torch.eye(x.shape[0])
            keep1 = keep.view(-1, 1)
            keep2 = keep.transpose(0, 1).contiguous().view(-1, 1)
            keep_idx = torch.nonzero(torch.cat((keep1, keep2), 0).flatten()).flatten()
            x1_ = torch.index_select(x1, dim=0, index=keep_idx)
            x2_ = torch.index_select(x2, dim=0, index=keep_idx)
            max_margin = F.relu(self.margin - (x1_ - x2_))
        return {"loss": max_margin.mean(), "max_margin_loss": max_margin.mean()}


# AVION main_lavila_finetune_mir.py lines 155-162: margin 0.2, fix_norm True
AVION_CRITERION = MaxMarginRankingLoss(margin=0.2, fix_norm=True)


@pytest.mark.parametrize("normalised", [True, False])
def test_max_margin_loss_and_gradients_are_avions(normalised: bool) -> None:
    """Value and gradients (float64) on rows with ties, hinges on both sides of the margin, and (unnormalised
    inputs) AVION's own normalisation; the relevancy ``weight`` changes nothing in AVION's either."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(7, 6, generator=g, dtype=torch.float64)
    t = v + 0.6 * torch.randn(7, 6, generator=g, dtype=torch.float64)  # some pairs within the margin, some not
    t[4] = t[3]  # tied texts
    if normalised:
        v, t = F.normalize(v, dim=-1), F.normalize(t, dim=-1)
    v1, t1 = v.clone().requires_grad_(), t.clone().requires_grad_()
    v2, t2 = v.clone().requires_grad_(), t.clone().requires_grad_()
    loss, parts = max_margin_loss(v1, t1, torch.tensor(1.0))
    ref = AVION_CRITERION(v2, t2, weight=torch.rand(7, generator=g, dtype=torch.float64))["loss"]
    assert 0 < float(ref) and abs(float(loss) - float(ref)) < 1e-12
    loss.backward()
    ref.backward()
    assert float((v1.grad - v2.grad).abs().max()) < 1e-12
    assert float((t1.grad - t2.grad).abs().max()) < 1e-12
    sim = F.normalize(t, dim=-1) @ F.normalize(v, dim=-1).T
    assert float(parts["clip_acc"]) == pytest.approx(100 * float((sim.argmax(0) == torch.arange(7)).double().mean()))
    assert float(parts["t2v_acc"]) == pytest.approx(100 * float((sim.argmax(1) == torch.arange(7)).double().mean()))


def test_max_margin_loss_refuses_a_batch_without_negatives() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        max_margin_loss(torch.ones(1, 4), torch.ones(1, 4), torch.tensor(1.0))


@pytest.mark.parametrize("frozen_scale", [True, False])
def test_feature_cache_max_margin_equals_one_batch(frozen_scale: bool) -> None:
    """3 micro-batches of 2 through the cache give AVION's loss and gradient on one batch of 6; the unused
    temperature gets no gradient, frozen or not, and nothing breaks either way."""
    from avion_ds.data.tokenizer import tokenize
    from avion_ds.models import create_model

    torch.manual_seed(0)
    model = create_model("clip_vit_test_tiny", drop_path_rate=0.0).double().train()
    model.logit_scale.requires_grad_(not frozen_scale)
    g = torch.Generator().manual_seed(1)
    frames = torch.randn(6, 3, 2, 32, 32, generator=g, dtype=torch.float64)
    tokens = tokenize([f"#C C takes object {i}" for i in range(6)])
    out = model(frames, tokens)
    ref = AVION_CRITERION(out.video, out.text)["loss"]
    ref.backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)

    def encode(i: int):
        o = model(frames[2 * i : 2 * i + 2], tokens[2 * i : 2 * i + 2])
        return o.video, o.text, o.logit_scale

    for loss, _ in feature_cache_losses(encode, 3, max_margin_loss):
        loss.backward()
        assert abs(float(loss) - float(ref)) < 1e-12
    got = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys() and "logit_scale" not in got
    for k, want in expected.items():
        assert float((got[k] - want).abs().max()) < 1e-9, k


def test_task_window_losses_are_max_margin() -> None:
    """The task's step goes through the max-margin loss (the contrastive task's through ClipLoss)."""
    from avion_ds.data.tokenizer import tokenize
    from avion_ds.models import create_model

    torch.manual_seed(0)
    model = create_model("clip_vit_test_tiny", drop_path_rate=0.0).double()
    frames = [torch.randn(2, 3, 2, 32, 32, dtype=torch.float64) for _ in range(2)]
    targets = [{"tokens": tokenize([f"#C C cuts thing {2 * i + j}" for j in range(2)])} for i in range(2)]
    with torch.no_grad():
        out = model(torch.cat(frames), torch.cat([t["tokens"] for t in targets]))
    recipe = load_recipe(None, ["task=mir", *MIR_FILES])
    losses = [float(loss) for loss, _ in task_of(recipe).window_losses(model, frames, targets, torch.float64, recipe)]
    assert losses == pytest.approx([float(AVION_CRITERION(out.video, out.text)["loss"])] * 2, abs=1e-12)


# ---- the task and its recipes
def test_mir_defaults_are_avions() -> None:
    """scripts/main_lavila_finetune_mir.py get_args_parser (lines 44-90) and main (126, 140)."""
    r = load_recipe(None, ["task=mir", *MIR_FILES])
    assert (r.data.dataset, r.data.val_dataset, r.data.num_frames, r.data.mean_std, r.data.crop_scale) == (
        "epic_mir",
        "epic_mir",
        16,
        "openai",
        [0.5, 1.0],
    )
    o, s = r.optim, r.schedule
    assert (o.name, o.lr, o.scale_lr, o.min_lr, o.weight_decay, o.betas, o.eps, o.clip_grad, o.no_decay) == (
        "adamw",
        3e-5,
        False,
        1e-5,
        0.01,
        [0.9, 0.999],
        1e-8,
        0.0,
        "avion",
    )
    assert (s.epochs, s.warmup_epochs, s.warmup_start_lr, s.fix_lr) == (100, 1.0, 1e-6, False)
    assert (r.eval.every_epochs, r.contrastive.freeze_temperature, r.model.drop_path_rate) == (5, True, 0.0)
    task = task_of(r)
    assert task.best_metric == "avg_map" and task.whole_window
    assert task.pair_loss() is max_margin_loss


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["data.dataset=ego4d", *MIR_FILES], "data.dataset"),
        (["data.val_dataset=ego4d", *MIR_FILES], "data.val_dataset"),
        (["epic_mir.train_sentences=s.csv"], "epic_mir.train_relevancy"),
        (["epic_mir.train_relevancy=r.pkl"], "epic_mir.train_sentences"),
        (["contrastive.freeze_temperature=false", *MIR_FILES], "contrastive.freeze_temperature"),
        (["batch.global_batch=1", "batch.micro_batch=1", *MIR_FILES], "batch.global_batch"),
    ],
)
def test_mir_recipe_refusals_name_the_key(overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_recipe(None, ["task=mir", *overrides])


@pytest.mark.parametrize(
    ("stem", "model", "pretrained"),
    [
        ("mir_vit_b_epic", "clip_vit_base_patch16_224", "pretrain_lavila_vitb"),
        ("mir_vit_l_epic", "clip_vit_large_patch14_224", "pretrain_lavila_vitl"),
    ],
)
def test_mir_recipes_are_avions(stem: str, model: str, pretrained: str) -> None:
    """MODEL_ZOO lines 66-79 (64 clips/GPU x 8 GPUs, flash, checkpointing, fast conv1) on the script's
    defaults, the released retrieval files."""
    r = load_recipe(REPO / "launch" / "recipes" / f"{stem}.yaml")
    assert (r.task, r.model.name, r.batch.global_batch, r.batch.micro_batch) == ("mir", model, 512, 64)
    assert pretrained in r.model.pretrained
    assert r.model.activation_checkpointing and r.model.patch_embed == "linear" and r.model.attn_backend == "auto"
    d = r.data
    assert d.train_csv.endswith("retrieval_annotations/EPIC_100_retrieval_train.csv")
    m = r.epic_mir
    assert m.train_sentences.endswith("retrieval_annotations/EPIC_100_retrieval_train_sentence.csv")
    assert m.train_relevancy.endswith("relevancy/caption_relevancy_EPIC_100_retrieval_train.pkl")
    assert d.val_csv.endswith("EPIC_100_retrieval_test.csv")
    assert m.val_relevancy.endswith("caption_relevancy_EPIC_100_retrieval_test.pkl")
    assert (d.num_frames, d.fps, d.mean_std, d.crop_scale, d.hflip) == (16, 0.0, "openai", [0.5, 1.0], 0.0)
    o, s = r.optim, r.schedule
    assert (o.lr, o.scale_lr, o.min_lr, o.weight_decay, o.betas, o.eps, o.clip_grad, o.no_decay) == (
        3e-5,
        False,
        1e-5,
        0.01,
        [0.9, 0.999],
        1e-8,
        0.0,
        "avion",
    )
    assert (s.epochs, s.warmup_epochs, s.warmup_start_lr, s.fix_lr, r.eval.every_epochs) == (100, 1, 1e-6, False, 5)
    assert r.contrastive.freeze_temperature

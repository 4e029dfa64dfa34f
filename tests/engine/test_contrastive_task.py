"""The contrastive task's recipe and training pieces that need no videos: AVION's no-decay rule, the
recipe checks, and the best-checkpoint record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avion_ds.config import ConfigError
from avion_ds.tasks import load_recipe

# a depth-2 AVION dual encoder (model_clip.py): key -> ndim of AVION's tensor
_BLOCK = {
    "ln_1.weight": 1,
    "ln_1.bias": 1,
    "attn.in_proj_weight": 2,
    "attn.in_proj_bias": 1,
    "attn.out_proj.weight": 2,
    "attn.out_proj.bias": 1,
    "ln_2.weight": 1,
    "ln_2.bias": 1,
    "mlp.c_fc.weight": 2,
    "mlp.c_fc.bias": 1,
    "mlp.c_proj.weight": 2,
    "mlp.c_proj.bias": 1,
}
AVION_KEYS = {
    "logit_scale": 0,
    "visual.class_embedding": 1,
    "visual.positional_embedding": 2,
    "visual.temporal_embedding": 2,
    "visual.conv1.weight": 4,
    "visual.ln_pre.weight": 1,
    "visual.ln_pre.bias": 1,
    "visual.ln_post.weight": 1,
    "visual.ln_post.bias": 1,
    "visual.proj": 2,
    "textual.token_embedding.weight": 2,
    "textual.positional_embedding": 2,
    "textual.ln_final.weight": 1,
    "textual.ln_final.bias": 1,
    "textual.text_projection": 2,
    **{
        f"{t}.transformer.resblocks.{i}.{k}": n
        for t in ("visual", "textual")
        for i in (0, 1)
        for k, n in _BLOCK.items()
    },
}


def avion_exempt(n: str, ndim: int) -> bool:
    """scripts/main_lavila_pretrain.py lines 155-157 (MIT licence)."""
    return ndim < 2 or "bias" in n or "ln" in n or "bn" in n or "pos_embed" in n or "positional_embedding" in n


def test_avion_no_decay_rule_matches_avions_on_its_names() -> None:
    from avion_ds.engine.optim import param_groups
    from avion_ds.models import create_model
    from avion_ds.models.clip.weights import map_clip_key

    model = create_model("clip_vit_test_tiny")
    ours = {n: g["weight_decay"] == 0.0 for g in param_groups(model, 0.01, 1.0, "avion") for n in g["names"]}
    theirs = {map_clip_key(k, "avion"): avion_exempt(k, nd) for k, nd in AVION_KEYS.items()}
    assert set(theirs) == set(ours)  # every parameter named, once
    assert ours == theirs


def test_contrastive_defaults_are_avions() -> None:
    r = load_recipe(None, ["task=contrastive"])
    assert (r.model.name, r.data.dataset, r.data.val_dataset, r.data.num_frames) == (
        "clip_vit_base_patch16_224",
        "ego4d",
        "epic_mir",
        4,
    )
    assert (r.optim.lr, r.optim.scale_lr, r.optim.betas, r.optim.eps, r.optim.weight_decay) == (
        3e-5,
        False,
        [0.9, 0.999],
        1e-8,
        0.01,
    )
    assert r.schedule.warmup_start_lr == 1e-6  # --lr-start: cosine_scheduler's start_warmup_value
    assert (r.optim.no_decay, r.optim.clip_grad, r.schedule.epochs, r.data.mean_std, r.data.fps) == (
        "avion",
        0.0,
        5,
        "openai",
        30.0,
    )


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("data.dataset=kinetics", "data.dataset"),
        ("eval.temporal_views=2", "eval.temporal_views"),
        ("data.mixup=0.8", "data.mixup"),
        ("data.val_dataset=ssv2", "data.val_dataset"),
    ],
)
def test_contrastive_recipe_refusals_name_the_key(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_recipe(None, ["task=contrastive", override])


def test_check_model_refuses_a_video_classifier() -> None:
    from avion_ds.tasks import task_of

    r = load_recipe(None, ["task=contrastive", "model.name=vit_test_tiny"])
    with pytest.raises(ConfigError, match="not a video-text dual encoder"):
        task_of(r).check_model(r)


def test_best_record_keeps_the_highest_and_survives_pruning(tmp_path: Path) -> None:
    from avion_ds.engine.run_checkpoints import prune, record_best
    from avion_ds.storage.run_dir import MARKER, best_tag, checkpoint_dir

    for step in (1, 2, 3, 4):
        d = checkpoint_dir(tmp_path) / f"step_{step:08d}"
        d.mkdir(parents=True)
        (d / MARKER).write_text("{}")
    assert record_best(tmp_path, "avg_map", 0.30, "step_00000001", 0, 1)
    assert record_best(tmp_path, "avg_map", 0.40, "step_00000002", 1, 2)
    assert not record_best(tmp_path, "avg_map", 0.35, "step_00000003", 2, 3)
    assert json.loads((tmp_path / "best.json").read_text())["tag"] == "step_00000002"
    prune(tmp_path, keep_last=1)
    left = sorted(p.name for p in checkpoint_dir(tmp_path).iterdir())
    assert left == ["step_00000002", "step_00000004"]
    assert best_tag(tmp_path) == "step_00000002"


def test_tag_best_resolves_through_best_json_or_refuses_in_one_line(tmp_path: Path) -> None:
    from avion_ds.engine.run_checkpoints import record_best
    from avion_ds.storage.run_dir import MARKER, checkpoint_dir, resolve_tag

    with pytest.raises(ConfigError, match="no best checkpoint"):
        resolve_tag(tmp_path, "best")
    d = checkpoint_dir(tmp_path) / "step_00000007"
    d.mkdir(parents=True)
    (d / MARKER).write_text("{}")
    record_best(tmp_path, "avg_map", 0.5, "step_00000007", 2, 7)
    assert resolve_tag(tmp_path, "best") == "step_00000007"
    assert resolve_tag(tmp_path, "step_00000003") == "step_00000003" and resolve_tag(tmp_path, None) is None


def test_eval_line_prints_the_text_to_video_headline() -> None:
    """The retrieval eval's headline (text -> video R-precision, in the JSON's report) is on the console line."""
    from avion_ds.tasks.contrastive.task import ContrastiveTask

    report = {"t2v_rprecision": 41.25, "t2v_rprecision_chance": 12.5, "protocol": "x"}
    line = ContrastiveTask().eval_line({"mAP_avg": 0.5}, report)
    assert line == "mAP_avg=0.500 | text->video R-precision 41.2% (chance 12.5%)"
    assert ContrastiveTask().eval_line({"clip_acc": 0.5}) == "clip_acc=0.500"

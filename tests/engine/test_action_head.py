"""EPIC with ONE action head (``epic.label: action``): AVION's head, an AVION-format CLS checkpoint
(``module.visual.*`` with its flash-attn / fast-conv1 names + ``module.fc_cls.*``, random weights) loads into the
``vit_clip_*`` classifier exactly and evaluates to AVION's metrics, and the recipe checks name the culprit."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.data import DeviceAugment, build_loader
from avion_ds.data.datasets.epic import epic_action_map
from avion_ds.engine.preflight import check_run_inputs
from avion_ds.engine.run_setup import build_split
from avion_ds.models import create_model
from avion_ds.tasks import load_recipe, task_of
from avion_ds.tasks.base import EvalContext
from avion_ds.tasks.common.action_head_metrics import AVION_KEYS
from avion_ds.tasks.common.evaluation import evaluate_model
from tests.engine.test_action_metrics import avion_validate, generate_label_map
from tests.models.test_video_tower import reference_layout


def action_recipe(data: dict, out: Path, *extra: str) -> object:
    actions = len(epic_action_map([data["train_csv"], data["val_csv"]]))
    return load_recipe(
        None,
        [
            "model.name=vit_clip_test_tiny",
            f"model.heads={{action: {actions}}}",
            "model.head_drop_rate=0.5",
            "model.head_init=avion",
            "data.dataset=epic",
            "epic.label=action",
            f"data.root={data['root']}",
            f"data.train_csv={data['train_csv']}",
            f"data.val_csv={data['val_csv']}",
            "data.num_frames=2",
            "data.size=32",
            "data.workers=0",
            "data.decoder=decord",
            "data.mean_std=openai",
            "eval.batch_size=4",
            "precision=fp32",
            f"output_dir={out}",
            *extra,
        ],
    )


def avion_cls_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model`` (a vit_clip_test_tiny classifier) as AVION's VideoClassifier writes it under DDP, as its
    MODEL_ZOO CLS command trains it (--use-flash-attn: ``attn.Wqkv`` / ``mlp.fc1`` / ``mlp.fc2``;
    --use-fast-conv1: a 2-D ``conv1``): ``module.visual.*`` (no projection) and ``module.fc_cls.*``."""
    tower = {f"visual.{k}": v for k, v in model.state_dict().items() if not k.startswith("heads.")}
    out = {}
    for key, v in reference_layout(tower, "avion").items():
        key = key.replace("attn.in_proj_weight", "attn.Wqkv.weight").replace("attn.in_proj_bias", "attn.Wqkv.bias")
        key = key.replace("mlp.c_fc", "mlp.fc1").replace("mlp.c_proj", "mlp.fc2")
        out[key] = v.flatten(1) if key.endswith("conv1.weight") else v
    head = model.heads["action"]
    return out | {"module.fc_cls.weight": head.weight.detach(), "module.fc_cls.bias": head.bias.detach()}


def test_the_action_head_is_avions(tiny_epic: dict, tmp_path: Path) -> None:
    """Dropout 0.5 then one Linear on ln_post of the class token (no projection), N(0, 0.01), zero bias."""
    recipe = action_recipe(tiny_epic, tmp_path, "model.heads={action: 3806}")
    torch.manual_seed(0)
    model = task_of(recipe).build_model(recipe)
    head = model.heads["action"]
    assert list(model.heads) == ["action"] and model.proj is None and model.head_drop.p == 0.5
    assert head.in_features == model.embed_dim and head.out_features == 3806
    assert float(head.weight.std()) == pytest.approx(0.01, rel=0.02) and abs(float(head.weight.mean())) < 1e-4
    assert not head.bias.any()
    x = torch.randn(2, 3, 2, 32, 32)
    seen = []
    handle = model.norm.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        logits = model.eval()(x)["action"]
    handle.remove()
    torch.testing.assert_close(logits, head(seen[0]))


def test_avion_cls_checkpoint_loads_and_evaluates(tiny_epic: dict, tmp_path: Path) -> None:
    recipe = action_recipe(tiny_epic, tmp_path / "run")
    task = task_of(recipe)
    actions = recipe.model.heads["action"]
    torch.manual_seed(1)
    ref = create_model("vit_clip_test_tiny", heads={"action": actions}, num_frames=2, img_size=32).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "avion_finetune_cls_best.pt"
    args = argparse.Namespace(model="CLIP_VITB16", clip_length=2, num_classes=actions, dataset="ek100_cls")
    torch.save({"epoch": 100, "state_dict": avion_cls_state(ref), "args": args, "best_acc1": 49.5}, path)

    run = tmp_path / "run"
    run.mkdir()
    model = task.build_model(recipe, pretrained=str(path), run_dir=run).eval()
    loaded = model.state_dict()
    for key, want in ref.state_dict().items():
        torch.testing.assert_close(loaded[key], want, rtol=0, atol=0, msg=key)
    report = json.loads((run / "pretrained_report.json").read_text())
    assert report["missing"] == [] and report["unexpected"] == [] and report["fresh"] == [], report
    assert any("classifier from fc_cls" in n for n in report["notes"]), report["notes"]

    dataset = build_split(recipe, task, "val", views=True)
    loader = build_loader(dataset, 4, 0, shuffle=False, seed=0, drop_last=False, distributed=False)
    augment = DeviceAugment(recipe.data, task.label_classes(recipe), train=False)
    cpu = torch.device("cpu")
    out = task.evaluate(EvalContext(model, loader, augment, cpu, recipe))
    _, (index, scores, labels), _ = evaluate_model(EvalContext(ref, loader, augment, cpu, recipe))
    theirs = generate_label_map([Path(tiny_epic["train_csv"]), Path(tiny_epic["val_csv"])])
    want = avion_validate(scores["action"].numpy(), labels["action"].numpy(), theirs)
    assert {k: out.metrics[k] for k in AVION_KEYS} == want
    usual = {f"{h}_{m}" for h in ("verb", "noun") for m in ("top1", "top5", "mean_class")}
    assert set(out.metrics) == usual | {"action_top1", "action_top5"} | set(AVION_KEYS)
    assert out.report["action_label_map"]["num_actions"] == actions == len(theirs)
    rows = out.per_sample
    assert [r["index"] for r in rows] == index.tolist() and len(rows) == tiny_epic["num_val"]
    for r in rows:
        csv_row = dataset.rows[r["index"]][1]
        assert r["action_label"] == theirs[f"{int(csv_row['verb_class'])}:{int(csv_row['noun_class'])}"]
        np.testing.assert_allclose(r["action_scores"], scores["action"][r["index"]].numpy(), atol=1e-6)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["model.heads={action: 5}"], "model.heads.action=5 but data.train_csv + data.val_csv make"),
        (["model.heads={verb: 4, noun: 3}"], "it needs exactly the heads action"),
        (["epic.label=verb_noun"], "it needs exactly the heads verb, noun"),
    ],
)
def test_recipe_checks_name_the_culprit(tiny_epic: dict, tmp_path: Path, extra: list[str], message: str) -> None:
    recipe = action_recipe(tiny_epic, tmp_path, *extra)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        check_run_inputs(recipe, task_of(recipe), need_train=True)
    assert "\n" not in str(err.value)

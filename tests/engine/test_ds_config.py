"""build_ds_config: "auto" filling, conflicts shown with numbers, bad files, precision, shipped JSONs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avion_ds.config import ConfigError
from avion_ds.distributed.ds_config import build_ds_config, resolve_batch
from avion_ds.distributed.ds_optimizer import scaled_lr
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.tasks import load_recipe

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "ds_configs").glob("*.json"))


def recipe(*overrides: str):
    base = [
        "data.dataset=kinetics",
        "model.name=vit_test_tiny",
        "batch.global_batch=32",
        "batch.micro_batch=4",
        "optim.lr=1e-3",
        "optim.base_batch=16",
        "optim.clip_grad=0.5",
    ]
    return load_recipe(None, base + list(overrides))


def test_auto_values_filled_from_recipe() -> None:
    cfg = build_ds_config(REPO / "ds_configs" / "zero2.json", recipe(), world_size=4, steps_per_epoch=10)
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (
        32,
        4,
        2,
    )
    assert cfg["optimizer"]["params"]["lr"] == pytest.approx(1e-3 * 32 / 16)  # linear scaling rule
    assert cfg["optimizer"]["params"]["betas"] == [0.9, 0.999]
    assert cfg["optimizer"]["params"]["weight_decay"] == pytest.approx(0.05)
    assert cfg["gradient_clipping"] == pytest.approx(0.5)
    assert DSPlan.of(cfg).zero_stage == 2 and DSPlan.of(cfg).precision == "fp32"  # CPU: auto precision -> fp32


def test_clipping_always_explicit_even_when_disabled() -> None:
    user = {"train_batch_size": "auto", "zero_optimization": {"stage": 1}}
    cfg = build_ds_config(user, recipe("optim.clip_grad=0"), world_size=2)
    assert cfg["gradient_clipping"] == 0.0  # DeepSpeed would default to 1.0 if absent


def test_batch_conflict_shows_numbers() -> None:
    user = {"train_batch_size": 256, "zero_optimization": {"stage": 2}}
    r = recipe("batch.global_batch=null", "batch.micro_batch=8", "batch.grad_accum=4")
    with pytest.raises(ConfigError, match=r"train_batch_size 256 != micro 8 x accum 4 x world 4 = 128"):
        build_ds_config(user, r, world_size=4)


def test_batch_not_divisible() -> None:
    with pytest.raises(ConfigError, match=r"global_batch 30 is not divisible by micro 4 x world 4 = 16"):
        resolve_batch(recipe("batch.global_batch=30"), 4)
    with pytest.raises(ConfigError, match=r"global_batch 32 != micro 4 x accum 3 x world 2 = 24"):
        resolve_batch(recipe("batch.grad_accum=3"), 2)


def test_concrete_json_value_conflicting_with_recipe() -> None:
    user = {"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}
    with pytest.raises(ConfigError, match=r"optimizer.params.lr=0.1 conflicts with the recipe value 0.002"):
        build_ds_config(user, recipe(), world_size=4)
    same = {"optimizer": {"type": "AdamW", "params": {"lr": 0.002}}, "gradient_accumulation_steps": 2}
    assert build_ds_config(same, recipe(), world_size=4)["optimizer"]["params"]["lr"] == pytest.approx(0.002)


def test_not_json_names_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{ zero_optimization: stage 2 ")
    with pytest.raises(ConfigError) as e:
        build_ds_config(bad, recipe(), world_size=1)
    assert str(bad) in str(e.value) and "not valid JSON" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="deepspeed config not found"):
        build_ds_config(tmp_path / "missing.json", recipe(), world_size=1)


def test_precision_from_json_and_recipe() -> None:
    user = {"bf16": {"enabled": True}}
    assert DSPlan.of(build_ds_config(user, recipe(), 1)).precision == "bf16"
    assert DSPlan.of(build_ds_config({"bf16": {"enabled": "auto"}}, recipe("precision=bf16"), 1)).precision == "bf16"
    with pytest.raises(ConfigError, match="conflicts with deepspeed config bf16.enabled=true"):
        build_ds_config(user, recipe("precision=fp16"), 1)
    with pytest.raises(ConfigError, match="both bf16 and fp16"):
        build_ds_config({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, recipe(), 1)


def test_scheduler_auto_steps() -> None:
    user = {
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": "auto",
                "warmup_num_steps": "auto",
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": "auto",
            },
        }
    }
    r = recipe("schedule.epochs=3", "schedule.warmup_epochs=0.5", "optim.layer_decay=1.0")
    cfg = build_ds_config(user, r, world_size=4, steps_per_epoch=10)
    p = cfg["scheduler"]["params"]
    assert (p["total_num_steps"], p["warmup_num_steps"]) == (30, 5)
    assert p["cos_min_ratio"] == pytest.approx(r.optim.min_lr / scaled_lr(r, 32))


def test_scheduler_section_with_layer_decay_is_refused() -> None:
    """A DeepSpeed JSON scheduler sets one lr for all groups: layer-wise decay would be dropped silently."""
    user = {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"}}}
    with pytest.raises(
        ConfigError,
        match=r"deepspeed config 'scheduler' \(WarmupCosineLR\) cannot be combined with "
        r"optim.layer_decay=0.75: .* or set optim.layer_decay=1.0",
    ):
        build_ds_config(user, recipe("optim.layer_decay=0.75"), world_size=1, steps_per_epoch=10)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_shipped_configs_build(path: Path, precision: str) -> None:
    cfg = build_ds_config(path, recipe(f"precision={precision}"), world_size=2, steps_per_epoch=5)
    assert DSPlan.of(cfg).precision == precision
    assert "auto" not in json.dumps(cfg)
    assert "activation_checkpointing" in cfg
    assert DSPlan.of(cfg).zero_stage == int(path.stem[4])


def test_overrides_deep_merge_before_filling() -> None:
    """Overrides change only the keys they name (nested), None removes a key, the rest is the JSON's."""
    base = json.loads((REPO / "ds_configs" / "zero3.json").read_text())
    over = {
        "zero_optimization": {"stage3_max_live_parameters": 7, "offload_param": {"device": "cpu"}},
        "activation_checkpointing": None,
    }
    cfg = build_ds_config(REPO / "ds_configs" / "zero3.json", recipe(), world_size=2, overrides=over)
    ref = build_ds_config(REPO / "ds_configs" / "zero3.json", recipe(), world_size=2)
    zo, zr = cfg["zero_optimization"], ref["zero_optimization"]
    assert zo["stage3_max_live_parameters"] == 7 and zo["offload_param"] == {"device": "cpu"}
    assert "activation_checkpointing" not in cfg and "activation_checkpointing" in ref
    assert {k: v for k, v in zo.items() if k not in ("stage3_max_live_parameters", "offload_param")} == {
        k: v for k, v in zr.items() if k != "stage3_max_live_parameters"
    }
    assert zo["reduce_bucket_size"] == base["zero_optimization"]["reduce_bucket_size"]
    assert base == json.loads((REPO / "ds_configs" / "zero3.json").read_text())  # the file is not modified
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=3 conflicts"):  # then checked as usual
        build_ds_config(
            REPO / "ds_configs" / "zero3.json", recipe(), 2, overrides={"train_micro_batch_size_per_gpu": 3}
        )

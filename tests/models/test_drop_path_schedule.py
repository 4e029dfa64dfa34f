"""Per-block drop-path rates: AVION's rule (one rate for every block of the video tower, none in the text
tower) for the CLIP-layout models, timm / VideoMAE's linear rise for the others, and the recipe key
``model.drop_path_schedule`` choosing either for any model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.models import create_model
from avion_ds.tasks import load_recipe


def avion_rates(drop_path_rate: float, layers: int) -> list[float]:
    """avion/models/transformer.py (MIT): ``Transformer`` builds ``layers`` ResidualAttentionBlocks, each with
    ``drop_path=drop_path`` (``DropPath(drop_path) if drop_path > 0. else nn.Identity()``)."""
    return [max(0.0, drop_path_rate) for _ in range(layers)]  # DropPath(r) if r > 0 else Identity (rate 0)


def videomae_rates(drop_path_rate: float, depth: int) -> list[float]:
    """VideoMAE modeling_finetune.py (CC-BY-NC): ``dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]``."""
    return [x.item() for x in torch.linspace(0, drop_path_rate, depth)]


def block_rates(blocks: nn.ModuleList) -> list[float]:
    return [float(getattr(b.drop_path, "drop_prob", 0.0)) for b in blocks]


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.35])
@pytest.mark.parametrize("name", ["clip_vit_test_tiny", "clip_vit_base_patch16_224", "clip_vit_large_patch14_224"])
def test_dual_encoder_video_tower_drops_at_one_rate_in_every_block_as_avion(name: str, rate: float) -> None:
    with torch.device("meta"):
        model = create_model(name, drop_path_rate=rate)
    assert block_rates(model.visual.blocks) == pytest.approx(avion_rates(rate, len(model.visual.blocks)))
    assert not any(type(m).__name__ == "DropPath" for m in model.textual.modules())  # AVION's text tower: none


@pytest.mark.parametrize("name", ["vit_clip_test_tiny", "vit_clip_base_patch16_224", "vit_clip_large_patch14_224"])
def test_tower_classifiers_drop_as_avion(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name, drop_path_rate=0.1)
    assert block_rates(model.blocks) == pytest.approx(avion_rates(0.1, len(model.blocks)))
    assert sum(block_rates(model.blocks)) / len(model.blocks) == pytest.approx(0.1)  # not 0.05 on average


@pytest.mark.parametrize("name", ["vit_test_tiny", "vit_base_patch16_224", "vit_giant_patch14_224"])
def test_videomae_models_keep_the_linear_rise(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name, drop_path_rate=0.2)
    assert block_rates(model.blocks) == pytest.approx(videomae_rates(0.2, len(model.blocks)), abs=1e-7)


def test_the_schedule_is_an_option_for_any_model() -> None:
    with torch.device("meta"):
        uniform = create_model("vit_test_tiny", drop_path_rate=0.3, drop_path_schedule="uniform")
        linear = create_model("vit_clip_test_tiny", drop_path_rate=0.3, drop_path_schedule="linear")
        dual = create_model("clip_vit_test_tiny", drop_path_rate=0.3, drop_path_schedule="linear")
    assert block_rates(uniform.blocks) == pytest.approx(avion_rates(0.3, len(uniform.blocks)))
    assert block_rates(linear.blocks) == pytest.approx(videomae_rates(0.3, len(linear.blocks)))
    assert block_rates(dual.visual.blocks) == pytest.approx(videomae_rates(0.3, len(dual.visual.blocks)))
    with pytest.raises(ValueError, match="drop_path_schedule expected one of linear, uniform"):
        create_model("vit_test_tiny", drop_path_schedule="cosine")


@pytest.mark.parametrize(
    ("overrides", "kwargs_of"),
    [
        (["task=contrastive", "model.name=clip_vit_test_tiny"], "contrastive"),
        (["model.name=vit_clip_test_tiny", "data.dataset=kinetics", "model.num_classes=5"], "finetune"),
    ],
)
def test_recipe_key_reaches_the_model(overrides: list[str], kwargs_of: str) -> None:
    from avion_ds.tasks.contrastive.task import _encoder_kwargs
    from avion_ds.tasks.finetune.task import model_kwargs

    fn = _encoder_kwargs if kwargs_of == "contrastive" else model_kwargs
    assert "drop_path_schedule" not in fn(load_recipe(None, overrides))  # unset: the model's own
    assert fn(load_recipe(None, [*overrides, "model.drop_path_schedule=linear"]))["drop_path_schedule"] == "linear"
    with pytest.raises(ConfigError, match="model.drop_path_schedule='cosine'"):
        load_recipe(None, [*overrides, "model.drop_path_schedule=cosine"])

"""``model.patch_dropout`` (FLIP): the recipe key reaches the fine-tuning model and the dual encoder's video
tower, drops that fraction of the patch tokens in training only, and is refused where masking already hides
patches (masked pretraining; UMT's table is tests/test_bad_input_umt.py)."""

from __future__ import annotations

import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.tasks import load_recipe

_FINETUNE = ["model.name=vit_test_tiny", "data.dataset=kinetics", "model.num_classes=5", "data.num_frames=4"]
_FINETUNE += ["data.size=32"]


def test_recipe_key_reaches_the_models() -> None:
    from avion_ds.tasks.contrastive.task import _encoder_kwargs
    from avion_ds.tasks.finetune.task import model_kwargs

    assert "patch_dropout" not in model_kwargs(load_recipe(None, _FINETUNE))  # off: the registered model exactly
    kw = model_kwargs(load_recipe(None, [*_FINETUNE, "model.patch_dropout=0.5"]))
    assert kw["patch_dropout"] == 0.5
    clip = ["task=contrastive", "model.name=clip_vit_test_tiny", "model.patch_dropout=0.5"]
    assert _encoder_kwargs(load_recipe(None, clip))["patch_dropout"] == 0.5

    from avion_ds.models import create_model

    model = create_model("vit_test_tiny", **kw)
    seen: list[int] = []
    model.blocks[0].register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    x = torch.randn(2, 3, 4, 32, 32)
    model.train()(x)
    model.eval()(x)
    assert seen == [4, 8]  # 8 patches: half dropped in training, all kept in evaluation


def test_masked_pretraining_refuses_patch_dropout() -> None:
    with pytest.raises(ConfigError, match=r"^model.patch_dropout=0.5: masked pretraining already hides"):
        load_recipe(None, ["task=pretrain", "model.name=pretrain_videomae_test_tiny", "model.patch_dropout=0.5"])

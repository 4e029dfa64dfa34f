"""Weight decay and layer decay see the same parameters whether a model is built plainly or under
ZeRO-3's ``zero.Init`` (one rank, in this process), for every registered model.

A partitioned parameter's data is an empty 1-D tensor, so any decision taken on ``p.ndim`` /
``p.shape`` instead of the logical shape puts every parameter in the no-decay group.
"""

from __future__ import annotations

import pytest
import torch

from avion_ds.distributed import dist
from avion_ds.engine.optim import param_groups
from avion_ds.models import ClipArch, create_model, list_models, registered_arch
from avion_ds.models.mae.sizes import pretrain_arch
from avion_ds.models.partition import is_partitioned, partitioned_construction
from tests.helpers.models import list_mae_models

ZERO3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}


def tiny_overrides(name: str) -> dict:
    """The registered model's own flags (patch size, MLP ratio, ...) at a size a CPU builds instantly."""
    pretrain = name in list_mae_models()
    patch = (pretrain_arch(name).encoder if pretrain else registered_arch(name)).patch_size
    kw = {"embed_dim": 32, "depth": 2, "num_heads": 2, "num_frames": 2, "img_size": 2 * patch}
    if pretrain:
        kw.update(decoder_dim=16, decoder_depth=1, decoder_heads=2)
    elif isinstance(registered_arch(name), ClipArch):  # dual encoder: a small text tower, no classifier
        kw.update(text_embed_dim=16, text_depth=2, text_num_heads=2, text_vocab_size=64, text_context_length=8)
    else:
        kw["num_classes"] = 3
    return kw


def decay_signature(model: torch.nn.Module) -> tuple[list, set[str]]:
    """(name, weight decay, lr scale) of every group with layer decay, and ``no_weight_decay()``."""
    groups = [(sorted(g["names"]), g["weight_decay"], g["lr_scale"]) for g in param_groups(model, 0.05, 0.75)]
    return groups, set(model.no_weight_decay())


@pytest.mark.parametrize("name", list_models())
def test_decayed_parameters_equal_plain_and_partitioned(
    one_rank: None, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)  # zero.Init replaces it for good
    dist.init()
    kw = tiny_overrides(name)
    plain = create_model(name, **kw)
    with partitioned_construction(ZERO3) as partitioned:
        part = create_model(name, **kw)
    assert partitioned and all(is_partitioned(p) and p.data.numel() == 0 for p in part.parameters())
    groups, no_wd = decay_signature(plain)
    decayed = {n for names, wd, _ in groups if wd > 0 for n in names}
    assert decayed and no_wd  # weight matrices decay; norms / biases / positions / mask token do not
    assert all(plain.get_parameter(n).dim() >= 2 for n in decayed)
    assert decay_signature(part) == (groups, no_wd)

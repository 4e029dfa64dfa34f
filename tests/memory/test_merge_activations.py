"""The activation formula stays exact with token merging on: every block counted on its own token count
(the schedule), the merges' own saves, the float32 sizes and the size-weighted pooling, against the
exact saved-tensor count, with checkpointing off, on every block, every k-th block and selective."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.memory.estimate import activation_bytes_per_clip, arch_info, estimate
from avion_ds.memory.merging import tokens_per_block
from avion_ds.models import create_model

CHECKPOINTING = (
    (False, None, "full"),
    (True, None, "full"),
    (2, None, "full"),
    (1, 2, "full"),
    (True, None, "selective"),
)


def _fast(name: str, **kw) -> nn.Module:
    """Uninitialised weights (values do not change saved bytes, only which tokens merge)."""
    with torch.device("meta"):
        model = create_model(name, **kw)
    return model.to_empty(device="cpu")


def _check(model: nn.Module, frames: int, size: int, dtype: torch.dtype, once: int = 0) -> None:
    info = arch_info(model)
    assert info.token_merge, "the model merges"
    for ckpt, first_n, policy in CHECKPOINTING:
        for batch in (1, 2):
            measured = measure_activation_bytes(
                model, (frames, size, batch), checkpointing=ckpt, first_n=first_n, policy=policy
            )
            predicted = batch * activation_bytes_per_clip(info, frames, size, dtype, ckpt, first_n, policy=policy)
            assert measured == predicted - (batch - 1) * once, (ckpt, first_n, policy, batch, measured, predicted)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("pool", "schedule"),
    [("mean", 4), ("mean", [3, 0, 5, 0]), ("mean", [0, 6, 0, 2]), ("cls", 4), ("cls", [5, 0, 3, 1])],
    ids=["mean-r4", "mean-schedule", "mean-late-start", "cls-r4", "cls-schedule"],
)
def test_classifier_formula_is_exact_with_merging(dtype: torch.dtype, pool: str, schedule: int | list[int]) -> None:
    model = _fast(
        "vit_test_tiny", depth=4, img_size=64, pool=pool, token_merge=schedule, layer_scale=0.1, drop_path_rate=0.0
    )
    _check(model.to(dtype), 4, 64, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dual_encoder_formula_is_exact_with_merging(dtype: torch.dtype) -> None:
    model = _fast("clip_vit_test_tiny", depth=3, token_merge=[4, 0, 3], drop_path_rate=0.1).to(dtype)
    _check(model, model.num_frames, 32, dtype, once=4)  # the fp32 logit scale's exp: once per batch


def test_merging_shrinks_the_estimate_and_off_is_unchanged() -> None:
    plain = _fast("vit_test_tiny", depth=4, img_size=64)
    off = _fast("vit_test_tiny", depth=4, img_size=64, token_merge=[0, 0, 0, 0])
    merging = _fast("vit_test_tiny", depth=4, img_size=64, token_merge=6)
    assert arch_info(off) == arch_info(plain)
    assert tokens_per_block(32, [6] * 4) == [32, 26, 20, 14, 8]
    act = [estimate(m, 4, 64, 8, "fp32").activations for m in (plain, merging)]
    assert act[1] < act[0]

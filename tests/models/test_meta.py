"""``meta_device``: shape-only builds on the meta device with the weight init skipped."""

from __future__ import annotations

import pytest
import torch

from avion_ds.models import create_model
from avion_ds.models.meta import meta_device


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny", "pretrain_videomae_test_tiny"])
def test_a_meta_build_has_the_real_builds_shapes(name: str) -> None:
    real = {k: tuple(v.shape) for k, v in create_model(name).state_dict().items()}
    with meta_device():
        model = create_model(name)
    assert all(p.is_meta for p in model.parameters())
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == real


def test_shape_changing_ops_still_run_and_real_tensors_keep_their_values() -> None:
    with meta_device():
        x = torch.empty(2, 3)
        x.t_()
        x.unsqueeze_(0)
        y = torch.zeros(2, device="cpu").fill_(1.0)
    assert x.is_meta and x.shape == (1, 3, 2)
    assert torch.equal(y, torch.ones(2))  # only meta tensors skip their value ops

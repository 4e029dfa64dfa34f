"""Activation checkpointing by wrapping: same gradients as plain, names unchanged, selection."""

from __future__ import annotations

import pytest
import torch

from avion_ds.memory.activations import SavedTensorTracker
from avion_ds.models import (
    apply_activation_checkpointing,
    create_model,
    remove_activation_checkpointing,
)
from avion_ds.models.activation_checkpointing import checkpoint_policies


def _grads(model, x, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    xg = x.clone().requires_grad_()
    out = model(xg)
    loss = sum(v.square().sum() for v in out.values()) if isinstance(out, dict) else out.square().sum()
    loss.backward()
    return loss.detach(), xg.grad, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("impl", ["torch", "deepspeed"])
def test_checkpointed_gradients_equal_plain(impl):
    torch.manual_seed(0)
    # drop path active (train mode): recompute must replay the same random masks
    model = create_model("vit_test_tiny", drop_path_rate=0.5, head_init_scale=1.0, heads={"a": 3, "b": 2}).train()
    x = torch.randn(2, 3, 4, 32, 32)
    ref = _grads(model, x)
    apply_activation_checkpointing(model, impl=impl)
    assert checkpoint_policies(model) == {0: impl, 1: impl}
    got = _grads(model, x)
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1], atol=1e-6, rtol=1e-5)
    for n in ref[2]:
        torch.testing.assert_close(got[2][n], ref[2][n], atol=1e-6, rtol=1e-5, msg=n)


def test_checkpointing_saves_activation_memory():
    model = create_model("vit_test_small")
    x = torch.randn(2, 3, 8, 64, 64)

    def saved_bytes() -> int:
        with SavedTensorTracker(exclude=model) as tracker:  # the package's saved-tensor counter
            model(x).sum()
        return tracker.stats.bytes

    plain = saved_bytes()
    apply_activation_checkpointing(model)
    assert saved_bytes() < plain / 2


def test_names_and_state_dict_unchanged():
    model = create_model("vit_test_small")
    before = list(model.state_dict())
    apply_activation_checkpointing(model, every=2, first_n=3)
    assert list(model.state_dict()) == before
    assert checkpoint_policies(model) == {0: "torch", 2: "torch"}
    apply_activation_checkpointing(model, first_n=1)  # re-applying replaces the selection
    assert checkpoint_policies(model) == {0: "torch"}
    remove_activation_checkpointing(model)
    assert checkpoint_policies(model) == {}


def test_no_grad_eval_skips_recompute_path():
    model = create_model("vit_test_tiny").eval()
    x = torch.randn(1, 3, 4, 32, 32)
    with torch.no_grad():
        ref = model(x)
        apply_activation_checkpointing(model)
        torch.testing.assert_close(model(x), ref)


def test_bad_arguments():
    model = create_model("vit_test_tiny")
    with pytest.raises(ValueError, match="impl"):
        apply_activation_checkpointing(model, impl="fairscale")
    with pytest.raises(ValueError, match="every"):
        apply_activation_checkpointing(model, every=0)
    with pytest.raises(TypeError, match="blocks"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2))


def test_deepcopy_keeps_checkpointing_on_the_copy():
    import copy

    model = apply_activation_checkpointing(create_model("vit_test_tiny"))
    clone = copy.deepcopy(model)
    assert checkpoint_policies(clone) == {0: "torch", 1: "torch"}
    x = torch.randn(1, 3, 4, 32, 32, requires_grad=True)
    clone(x).sum().backward()
    assert clone.blocks[0].attn.qkv.weight.grad is not None and model.blocks[0].attn.qkv.weight.grad is None


def test_wrapper_with_module_attribute_is_accepted():
    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    inner = create_model("vit_test_tiny")
    apply_activation_checkpointing(Wrapper(inner), first_n=1)
    assert checkpoint_policies(inner) == {0: "torch"}


def test_create_model_from_config_applies_recipe():
    from avion_ds.config import ModelConfig
    from tests.helpers.models import create_model_from_config

    cfg = ModelConfig(
        name="vit_test_tiny",
        heads={"verb": 4, "noun": 3},
        activation_checkpointing=True,
        activation_checkpoint_every=2,
        attn_backend="eager",
        drop_path_rate=0.1,
    )
    model = create_model_from_config(cfg, num_frames=8, img_size=32)
    assert model.num_frames == 8 and model.heads_spec == {"verb": 4, "noun": 3}
    assert model.arch.attn_backend == "eager" and checkpoint_policies(model) == {0: "torch"}

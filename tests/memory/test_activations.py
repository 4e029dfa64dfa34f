"""Exact saved-tensor accounting, and the analytic formula against it for every registered size."""

import pytest
import torch
from torch import nn

import avion_ds.models.activation_checkpointing as checkpointing
from avion_ds.memory.activations import SavedTensorTracker, measure_activation_bytes
from avion_ds.memory.estimate import activation_bytes_per_clip, arch_info
from avion_ds.models import create_model, list_models, registered_arch


def _fast_model(name: str, frames: int, depth: int = 2, **kw) -> nn.Module:
    """A depth-reduced copy with uninitialised weights (values do not change saved bytes)."""
    with torch.device("meta"):
        model = create_model(name, depth=depth, num_frames=frames, **kw)
    return model.to_empty(device="cpu")


def test_views_count_once_and_parameters_are_excluded():
    lin = nn.Linear(8, 24, bias=False)
    x = torch.randn(4, 8)
    with SavedTensorTracker(lin) as tr:
        qkv = lin(x)  # saves x (and the weight, excluded)
        q, k, v = qkv.view(4, 3, 8).unbind(1)  # three views of one storage
        out = (q * k).sum() + (k * v).sum()
    assert tr.stats.num_saves >= 4
    assert tr.stats.bytes == x.numel() * 4 + qkv.numel() * 4
    assert out.requires_grad


def test_checkpointing_keeps_only_block_inputs_and_leaves_model_untouched():
    model = create_model("vit_test_tiny")
    full = measure_activation_bytes(model)
    ckpt = measure_activation_bytes(model, checkpointing=True)
    assert checkpointing.checkpoint_policies(model) == {}  # measured on a copy
    assert ckpt < 0.6 * full
    tokens = (model.num_frames // model.tubelet_size) * (model.img_size // model.patch_size) ** 2
    per_block_input = tokens * model.embed_dim * 4
    # removing both blocks' activations and keeping their inputs is the whole difference
    info = arch_info(model)
    assert ckpt == activation_bytes_per_clip(info, model.num_frames, model.img_size, torch.float32, True)
    assert ckpt >= model.depth * per_block_input


def test_activation_bytes_scale_with_batch():
    model = create_model("vit_test_tiny")
    one = measure_activation_bytes(model, (4, 32, 1))
    three = measure_activation_bytes(model, (4, 32, 3))
    assert abs(three - 3 * one) <= 64  # drop-path masks and LN stats are per sample too


@pytest.mark.parametrize("name", [n for n in list_models() if n.startswith("vit_")])  # ViT archs
def test_formula_within_10_percent_every_size_two_frame_counts(name):
    """Activations are linear in depth, so depth-2 copies with each size's width/heads/patch check the
    per-block formula; the full-depth estimate is that formula with the real depth."""
    arch = registered_arch(name)
    size = arch.img_size if arch.img_size <= 64 else 112  # keeps 2-core CPU cost low; tokens still vary
    size -= size % arch.patch_size
    for frames in (2 * arch.tubelet_size, 4 * arch.tubelet_size):
        model = _fast_model(name, frames, img_size=size, drop_path_rate=0.1)
        info = arch_info(model)
        for ckpt in (False, 1):
            measured = measure_activation_bytes(model, (frames, size, 1), checkpointing=ckpt)
            predicted = activation_bytes_per_clip(info, frames, size, torch.float32, ckpt)
            assert abs(predicted / measured - 1) <= 0.10, (name, frames, ckpt, measured, predicted)


def test_formula_bf16_and_eager_and_every_k():
    model = _fast_model("vit_small_patch16_224", 4, depth=4, img_size=64).to(torch.bfloat16)
    info = arch_info(model)
    for ckpt in (False, 2):
        measured = measure_activation_bytes(model, (4, 64, 1), checkpointing=ckpt)
        predicted = activation_bytes_per_clip(info, 4, 64, torch.bfloat16, ckpt)
        assert abs(predicted / measured - 1) <= 0.10, (ckpt, measured, predicted)
    eager = _fast_model("vit_test_tiny", 4, attn_backend="eager")
    measured = measure_activation_bytes(eager, (4, 32, 1))
    predicted = activation_bytes_per_clip(arch_info(eager), 4, 32, torch.float32, False)
    assert abs(predicted / measured - 1) <= 0.10, (measured, predicted)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_formula_exact_per_checkpoint_policy(backend: str, dtype: torch.dtype) -> None:
    """Each policy's estimate equals the exact count with every block checkpointed (selective: what
    torch's selective checkpoint caches reaches the tracker's hooks); for every k-th / the first n
    blocks the policy's share (selective minus full) is exact too."""
    model = _fast_model("vit_test_tiny", 4, depth=3, attn_backend=backend, layer_scale=0.1).to(dtype)
    info = arch_info(model)

    def both(ckpt: bool | int, first_n: int | None, policy: str) -> tuple[int, int]:
        measured = measure_activation_bytes(model, (4, 32, 2), checkpointing=ckpt, first_n=first_n, policy=policy)
        return measured, 2 * activation_bytes_per_clip(info, 4, 32, dtype, ckpt, first_n, backend, policy)

    for policy in ("full", "selective"):
        assert both(True, None, policy)[0] == both(True, None, policy)[1], policy
    for ckpt, first_n in ((2, None), (1, 2)):
        (m_sel, p_sel), (m_full, p_full) = both(ckpt, first_n, "selective"), both(ckpt, first_n, "full")
        assert m_sel - m_full == p_sel - p_full > 0, (ckpt, first_n, m_sel, m_full, p_sel, p_full)
    none = measure_activation_bytes(model, (4, 32, 2))
    assert both(True, None, "full")[0] < both(True, None, "selective")[0] < none

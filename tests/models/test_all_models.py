"""Every registered model, as timm's tests/test_models.py: video ViT classifiers (``vit_*``, ``vit_clip_*``),
masked-autoencoder pretraining models (``pretrain_videomae_*``) and video-text dual encoders (``clip_*``).

For each name a tiny instance (width 32, one block, two tubelets of two patches per side; small decoder /
text tower) is built, runs a forward on its family's input and a backward that reaches every trainable
parameter, then loads its own state dict strictly: with ``load_state_dict(strict=True)``, through the
family's weight adapter (``load_weights(strict=True)`` -> ``model.prepare_checkpoint``) and through
``create_model(name, pretrained=state_dict)``; each copy must then give the same outputs. Every name also
builds at its registered size on the meta device (no memory), with the tiny instance's parameter names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from avion_ds.models import (
    ClipArch,
    MAEArch,
    ViTArch,
    create_model,
    list_models,
    load_weights,
    pretrain_arch,
    registered_arch,
)
from avion_ds.models.mae.sizes import pretrain_names

BATCH = 2
TEXT = {"text_embed_dim": 16, "text_depth": 1, "text_num_heads": 2, "text_context_length": 8, "text_vocab_size": 64}


def arch_of(name: str) -> Any:
    """The registered architecture of any name: ``MAEArch``, ``ClipArch`` or ``ViTArch``."""
    return pretrain_arch(name) if name in pretrain_names() else registered_arch(name)


def tiny_video(arch: ViTArch) -> dict[str, Any]:
    """Overrides that shrink a video transformer and keep its layout (patch size, tubelet, pooling...)."""
    return {
        "embed_dim": 32,
        "depth": 1,
        "num_heads": 2,
        "num_frames": 2 * arch.tubelet_size,
        "img_size": 2 * arch.patch_size,
    }


def tiny_overrides(name: str) -> dict[str, Any]:
    """The tiny form of a registered name, by its family (its architecture's type)."""
    arch = arch_of(name)
    if isinstance(arch, MAEArch):
        return tiny_video(arch.encoder) | {"decoder_dim": 16, "decoder_depth": 1, "decoder_heads": 2}
    if isinstance(arch, ClipArch):
        return tiny_video(arch.vision) | TEXT | {"proj_dim": 8}
    if isinstance(arch, ViTArch):
        return tiny_video(arch)
    raise AssertionError(
        f"{name}: no tiny form for a {type(arch).__name__}; add its family to tests/models/test_all_models.py"
    )


def clip_input(model: nn.Module, gen: torch.Generator) -> torch.Tensor:
    a = model.arch.video_transformer
    return torch.randn(BATCH, a.in_chans, a.num_frames, a.img_size, a.img_size, generator=gen)


def model_inputs(model: nn.Module) -> tuple[torch.Tensor, ...]:
    """The family's forward arguments, the same for every call: (clip,), (clip, mask) or (clip, tokens)."""
    gen = torch.Generator().manual_seed(0)
    x = clip_input(model, gen)
    if isinstance(model.arch, MAEArch):
        n = model.num_tokens
        order = torch.rand(BATCH, n, generator=gen).argsort(dim=1)
        mask = torch.zeros(BATCH, n, dtype=torch.bool)
        mask.scatter_(1, order[:, : n // 2], True)  # half of the tokens hidden in every clip
        return (x, mask)
    if isinstance(model.arch, ClipArch):
        t = model.arch.text
        return (x, torch.randint(0, t.vocab_size, (BATCH, t.context_length), generator=gen))
    return (x,)


def outputs(model: nn.Module) -> list[torch.Tensor]:
    """The forward's tensors in a fixed order (logits / per-head dict / MAEOutput / dual-encoder output)."""
    out = model(*model_inputs(model))
    if isinstance(out, dict):
        return [out[k] for k in sorted(out)]
    return list(out) if isinstance(out, tuple) else [out]


def check_shapes(name: str, model: nn.Module, out: list[torch.Tensor]) -> None:
    arch = model.arch
    if isinstance(arch, MAEArch):
        loss, pred, target = out
        hidden = model.num_tokens // 2
        assert loss.dim() == 0 and torch.isfinite(loss), name
        assert pred.shape == target.shape == (BATCH, hidden, arch.pixels_per_token), (name, pred.shape)
    elif isinstance(arch, ClipArch):
        video, text, scale = out
        assert video.shape == text.shape == (BATCH, arch.vision.proj_dim), name
        assert torch.allclose(video.norm(dim=-1), torch.ones(BATCH), atol=1e-5), name
        assert scale.dim() == 0, name
    else:
        widths = sorted(arch.heads.items()) if arch.heads else [("", arch.num_classes or arch.feature_dim)]
        assert [tuple(o.shape) for o in out] == [(BATCH, n) for _, n in widths], (name, [o.shape for o in out])


def build(name: str, seed: int, **extra: Any) -> nn.Module:
    torch.manual_seed(seed)
    return create_model(name, **tiny_overrides(name), **extra).eval()


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6, rtol=1e-5) for x, y in zip(a, b, strict=True))


NAMES = list_models()


def test_every_family_is_covered() -> None:
    kinds = {type(arch_of(n)) for n in NAMES}
    assert kinds == {ViTArch, MAEArch, ClipArch}, kinds
    assert len(NAMES) >= 20, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_forward_backward(name: str) -> None:
    model = build(name, seed=0).train()
    out = outputs(model)
    check_shapes(name, model, out)
    sum(o.float().sum() for o in out).backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f"{name}: parameters the forward never reaches: {no_grad}"


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_loads_its_own_state_dict(name: str) -> None:
    model = build(name, seed=0)
    with torch.no_grad():
        ref = outputs(model)
    sd = model.state_dict()
    loaders: dict[str, Callable[[], nn.Module]] = {
        "load_state_dict": lambda: _loaded(build(name, seed=1), lambda m: m.load_state_dict(sd, strict=True)),
        "load_weights": lambda: _loaded(build(name, seed=2), lambda m: load_weights(m, sd, strict=True)),
        "create_model(pretrained=)": lambda: build(name, seed=3, pretrained=sd),
    }
    fresh = build(name, seed=4)
    with torch.no_grad():
        assert not same(outputs(fresh), ref), f"{name}: another seed gives the same outputs; the check is void"
    for how, load in loaders.items():
        copy = load()
        with torch.no_grad():
            assert same(outputs(copy), ref), f"{name}: {how} of its own state dict changed the outputs"
        assert copy.state_dict().keys() == sd.keys(), (name, how)


def _loaded(model: nn.Module, load: Callable[[nn.Module], Any]) -> nn.Module:
    load(model)
    return model


@pytest.mark.parametrize("name", NAMES)
def test_registered_size_builds_on_meta(name: str) -> None:
    """The registered size itself (meta device: shapes only, nothing allocated) has the tiny form's names."""
    with torch.device("meta"):
        full = create_model(name)
    tiny = build(name, seed=0)

    def layout(m: nn.Module) -> set[str]:
        return {re.sub(r"\.\d+\.", ".N.", k) for k in m.state_dict()}

    assert layout(full) == layout(tiny), name
    assert sum(p.numel() for p in full.parameters()) > sum(p.numel() for p in tiny.parameters()), name

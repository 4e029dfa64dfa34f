"""Text tower, tokenizer and dual encoder: parity with OpenCLIP (random weights, fixed seed)."""

from __future__ import annotations

import math

import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.data import tokenizer as tokenizer_mod
from avion_ds.data.tokenizer import tokenize
from avion_ds.models import apply_activation_checkpointing, create_model, load_weights
from avion_ds.models.activation_checkpointing import checkpoint_policies

open_clip = pytest.importorskip("open_clip")

OPENAI_B16 = {"num_frames": 1, "act": "quick_gelu", "norm_eps": 1e-5, "proj_dim": 512}
AWKWARD = [
    "",
    "a photo of a cat",
    "The Cafe\u0301 &amp; the &lt;b&gt;bar&lt;/b&gt;   with   spaces\n\ttabs",
    "mojibake: doesnâ€™t â€œquoteâ€\x9d",  # ftfy repairs UTF-8 read as cp1252
    "emoji \U0001f600\U0001f44d\U0001f3fd and CJK \u6f22\u5b57, accents \u00e9\u00e8",
    " ".join(["#C C picks up the knife from the chopping board"] * 12),  # > 77 tokens
]


@pytest.fixture(scope="module")
def pair() -> tuple:
    """OpenCLIP ViT-B/16 (QuickGELU) and our dual encoder loaded from its state dict."""
    torch.manual_seed(0)
    ref = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None).eval()
    with torch.no_grad():  # non-trivial values where OpenCLIP initialises constants
        for name, p in ref.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        ref.logit_scale.fill_(2.5)
    ours = create_model("clip_vit_base_patch16_224", **OPENAI_B16).eval()
    report = load_weights(ours, ref.state_dict(), strict=True)
    return ref, ours, report


def test_tokenizer_ids_equal_open_clip_on_awkward_strings() -> None:
    """OpenCLIP's own tokenizer (its module run without the open_clip package's heavy ``__init__``) gives the
    ids ``open_clip.tokenize`` gives."""
    got = tokenize(AWKWARD)
    want = open_clip.tokenize(AWKWARD)
    assert got.dtype == torch.int64 and got.shape == (len(AWKWARD), 77)
    assert torch.equal(got, want)
    sot, eot = 49406, 49407
    assert (got[:, 0] == sot).all() and (got.argmax(-1) == (got == eot).int().argmax(-1)).all()
    assert got[0, :3].tolist() == [sot, eot, 0]  # empty text: start, end, padding
    assert got[-1, -1] == eot  # cut to 77 keeping the end token
    assert torch.equal(tokenize("a photo of a cat"), got[1:2])


def test_tokenizing_leaves_the_open_clip_models_and_transformers_unimported() -> None:
    """What a process that only tokenizes (a rank's dataset, eval, embed, search) imports: not the open_clip
    package's models nor transformers (~0.8 s of CPU)."""
    import subprocess
    import sys

    from tests.helpers import REPO, engine_env

    code = "import sys; from avion_ds.data.tokenizer import tokenize; tokenize('x'); "
    code += "print(sorted(m for m in ('open_clip', 'transformers') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=engine_env(), capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("missing", ["open_clip", "ftfy"])
def test_tokenizer_names_the_extra_when_open_clip_is_missing(missing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (missing, "open_clip.tokenizer"):
        monkeypatch.setitem(__import__("sys").modules, name, None)
    tokenizer_mod._tokenizer.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"avion_ds\[clip\]"):
            tokenize(["x"])
    finally:
        tokenizer_mod._tokenizer.cache_clear()


@pytest.mark.timeout(120)
def test_text_tower_equals_open_clip_encode_text(pair: tuple) -> None:
    ref, ours, report = pair
    assert report.format == "clip" and not report.missing and not report.unexpected
    tokens = tokenize(AWKWARD)
    with torch.no_grad():
        want = ref.encode_text(tokens)
        got = ours.encode_text(tokens)
    assert got.shape == want.shape == (len(AWKWARD), 512)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.timeout(120)
def test_dual_encoder_forward_equals_open_clip(pair: tuple) -> None:
    ref, ours, _ = pair
    x = torch.randn(2, 3, 224, 224)
    tokens = tokenize(AWKWARD[1:3])
    with torch.no_grad():
        video, text, scale = ours(x.unsqueeze(2), tokens)
        want_v, want_t, want_scale = ref(x, tokens)  # normalised features and logit_scale.exp()
    torch.testing.assert_close(video, want_v, rtol=0, atol=1e-5)
    torch.testing.assert_close(text, want_t, rtol=0, atol=1e-5)
    torch.testing.assert_close(scale, want_scale.reshape(()))
    torch.testing.assert_close(video.norm(dim=-1), torch.ones(2))


def test_logit_scale_init_unclamped_forward_and_freeze() -> None:
    """The forward multiplies by exp(t) as it is (AVION clamps the parameter after the step, not in the
    forward: tests/engine/test_temperature_clamp.py), in float32 for a 16-bit model too."""
    m = create_model("clip_vit_test_tiny")
    assert m.logit_scale.item() == pytest.approx(math.log(1 / 0.07))
    assert m.scale().item() == pytest.approx(1 / 0.07, rel=1e-5)
    with torch.no_grad():
        m.logit_scale.fill_(7.0)
    assert m.scale().item() == pytest.approx(math.exp(7.0), rel=1e-5)  # not clamped in the forward
    assert m.scale().dtype == torch.float32
    m_bf16 = create_model("clip_vit_test_tiny").to(torch.bfloat16)
    assert m_bf16.scale().dtype == torch.float32
    frozen = create_model("clip_vit_test_tiny", freeze_logit_scale=True)
    assert not frozen.logit_scale.requires_grad and "logit_scale" in frozen.no_weight_decay()


def test_checkpointing_covers_both_towers_with_equal_gradients() -> None:
    torch.manual_seed(0)
    m = create_model("clip_vit_test_tiny", drop_path_rate=0.3).train()
    x, tokens = torch.randn(2, 3, 2, 32, 32), tokenize(["a b", "c"])

    def grads() -> dict:
        m.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        v, t, s = m(x, tokens)
        (s * (v @ t.t())).logsumexp(-1).sum().backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    ref = grads()
    apply_activation_checkpointing(m, first_n=1)
    assert checkpoint_policies(m) == {0: "torch", 2: "torch"}  # the first block of each tower
    apply_activation_checkpointing(m)
    assert len(checkpoint_policies(m)) == 4
    got = grads()
    assert set(got) == set(ref) and "logit_scale" in ref and "textual.token_embedding.weight" in ref
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=1e-6, rtol=1e-5, msg=n)


def test_registered_sizes_and_overrides() -> None:
    from avion_ds.models import count_params, registered_arch

    b16 = registered_arch("clip_vit_base_patch16_224")
    assert (b16.vision.embed_dim, b16.text.embed_dim, b16.text.num_heads, b16.proj_dim) == (768, 512, 8, 256)
    assert (b16.vision.act, b16.vision.norm_eps, b16.text.norm_eps) == ("gelu", 1e-6, 1e-5)  # AVION's towers
    l14 = registered_arch("clip_vit_large_patch14_336", text_depth=6, proj_dim=768)
    assert (l14.img_size, l14.patch_size, l14.text.embed_dim, l14.text.depth, l14.text.proj_dim) == (
        336,
        14,
        768,
        6,
        768,
    )
    with torch.device("meta"):
        n = count_params(create_model("clip_vit_base_patch16_224", **OPENAI_B16))
    assert n == 149_620_737  # OpenAI CLIP ViT-B/16 (logit scale stored as (1,))
    with pytest.raises(ValueError, match="no classifier"):
        registered_arch("clip_vit_test_tiny", num_classes=3)
    with pytest.raises(TypeError, match="unknown text option"):
        registered_arch("clip_vit_test_tiny", text_widht=3)

"""VideoMAE pretraining model: sizes, loss against Hugging Face ``VideoMAEForPreTraining`` (random
weights, loaded both ways), V2 dual masking, and every checkpoint layout into pretraining and
fine-tuning models."""

from __future__ import annotations

import math

import pytest
import torch

from avion_ds.data.masking import MaskSpec
from avion_ds.models import (
    count_params,
    create_model,
    load_weights,
)
from avion_ds.models.mae.weights import decoder_dims, detect_mae_format
from tests.helpers.mae_layouts import to_hf, to_official

transformers = pytest.importorskip("transformers")

SIZES = {  # name: (encoder dim, depth, decoder dim, decoder heads, pixels per token)
    "pretrain_videomae_small_patch16_224": (384, 12, 192, 3, 1536),
    "pretrain_videomae_base_patch16_224": (768, 12, 384, 6, 1536),
    "pretrain_videomae_large_patch16_224": (1024, 24, 512, 8, 1536),
    "pretrain_videomae_huge_patch16_224": (1280, 32, 512, 8, 1536),
    "pretrain_videomae_v1_huge_patch16_224": (1280, 32, 640, 8, 1536),
    "pretrain_videomae_giant_patch14_224": (1408, 40, 512, 8, 1176),
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_registered_sizes(name: str) -> None:
    dim, depth, ddim, dheads, pix = SIZES[name]
    with torch.device("meta"):
        m = create_model(name)
        ft = create_model(name.replace("pretrain_videomae_", "vit_").replace("v1_", ""), num_classes=0)
    assert (m.encoder.embed_dim, m.encoder.depth, m.arch.decoder_dim, m.arch.decoder_heads) == (
        dim,
        depth,
        ddim,
        dheads,
    )
    assert len(m.decoder.blocks) == 4 and m.decoder.head.out_features == pix
    assert m.encoder_to_decoder.bias is None and m.mask_token.shape == (1, 1, ddim)
    # the encoder IS the fine-tuning ViT (no head): same parameter count
    assert count_params(m.encoder) == count_params(ft)


def _hf_pair(norm_pix: bool = True, **cfg):
    """A random-weight HF VideoMAEForPreTraining and our tiny model holding its weights."""
    config = transformers.VideoMAEConfig(
        image_size=32,
        patch_size=16,
        num_frames=4,
        tubelet_size=2,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        decoder_hidden_size=32,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=128,
        norm_pix_loss=norm_pix,
        layer_norm_eps=1e-6,
        use_mean_pooling=False,
        attn_implementation="sdpa",
        **cfg,
    )
    torch.manual_seed(0)
    hf = transformers.VideoMAEForPreTraining(config).eval()
    # Hugging Face's decoder LayerNorm keeps PyTorch's eps (1e-5); the official code uses 1e-6
    ours = create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5, norm_pix_loss=norm_pix).eval()
    report = load_weights(ours, hf.state_dict(), strict=True)
    assert report.format == "hf (pretraining)"
    return hf, ours


def _tube_masks(batch: int, grid=(2, 2, 2), ratio=0.5, seed=0) -> torch.Tensor:
    spec = MaskSpec(grid, "tube", ratio).validate()
    import numpy as np

    rng = np.random.default_rng(seed)
    return torch.stack([torch.from_numpy(spec.draw(rng)["mask"]) for _ in range(batch)])


@pytest.mark.parametrize("norm_pix", [True, False])
def test_loss_matches_hugging_face(norm_pix: bool) -> None:
    hf, ours = _hf_pair(norm_pix)
    x = torch.randn(4, 3, 4, 32, 32)
    mask = _tube_masks(4)
    assert len({tuple(m.tolist()) for m in mask}) > 1  # a different tube mask per clip
    with torch.no_grad():
        ref = hf(x.transpose(1, 2), bool_masked_pos=mask)
        out = ours(x, mask)
    assert out.loss.dim() == 0
    assert out.pred.shape == ref.logits.shape == (4, int(mask[0].sum()), 2 * 16 * 16 * 3)
    torch.testing.assert_close(out.pred, ref.logits, rtol=1e-4, atol=1e-5)
    assert abs(float(out.loss) - float(ref.loss)) <= 1e-5 * abs(float(ref.loss))


def test_gradients_and_dual_masking() -> None:
    hf, ours = _hf_pair(norm_pix=False)  # raw-pixel targets differ per token (normalised ones all square to (n-1)/n)
    x = torch.randn(2, 3, 4, 32, 32)
    mask = _tube_masks(2)
    # V2 without a decoder mask (its fallback decode_mask = ~mask) is exactly v1
    with torch.no_grad():
        assert torch.equal(ours(x, mask, ~mask).loss, ours(x, mask).loss)
    # dual masking: the decoder predicts the positions the decoder mask leaves open; the loss
    # averages over the ones the encoder did not see, against the same pixels Hugging Face targets
    decode_mask = torch.ones(2, 8, dtype=torch.bool)
    for b in range(2):  # decode 2 hidden and 2 visible tokens per clip: only the hidden 2 count
        decode_mask[b, mask[b].nonzero()[:2, 0]] = False
        decode_mask[b, (~mask[b]).nonzero()[:2, 0]] = False
    out = ours(x, mask, decode_mask)
    assert out.pred.shape == (2, 4, 1536)
    out.loss.backward()
    assert ours.mask_token.grad is not None and ours.encoder.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    with torch.no_grad():
        hf.decoder.head.weight.zero_()
        hf.decoder.head.bias.zero_()  # a zero prediction: HF's loss = mean of its labels squared
        ours.decoder.head.weight.zero_()
        ours.decoder.head.bias.zero_()
        zero_pred = ours(x, mask, decode_mask).loss
    # our loss with a zero prediction = mean square target over (decoded & hidden) tokens; compare
    # with Hugging Face's targets token by token (one token per HF call)
    want = []
    for b, n in (~decode_mask & mask).nonzero().tolist():
        single = torch.zeros(1, 8, dtype=torch.bool)
        single[0, n] = True
        with torch.no_grad():
            want.append(float(hf(x[b : b + 1].transpose(1, 2), bool_masked_pos=single).loss))
    assert abs(float(zero_pred) - sum(want) / len(want)) < 1e-5


def test_bad_masks_are_one_line_errors() -> None:
    m = create_model("pretrain_videomae_test_tiny")
    x = torch.randn(2, 3, 4, 32, 32)
    uneven = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match="same number of tokens"):
        m(x, uneven)
    with pytest.raises(ValueError, match=r"mask: expected a bool tensor of shape \(2, 8\)"):
        m(x, uneven.float())
    with pytest.raises(ValueError, match="num_classes"):
        create_model("pretrain_videomae_test_tiny", num_classes=10)


def test_official_round_trip_and_formats() -> None:
    _, ours = _hf_pair()
    official = to_official(ours)
    assert (
        "encoder.norm.weight" in official["model"] and official["model"]["encoder.patch_embed.proj.weight"].dim() == 5
    )
    assert detect_mae_format(official["model"]) == "videomae"
    assert detect_mae_format(ours.state_dict()) == "avion_ds"
    again = create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5).eval()
    assert load_weights(again, official, strict=True).format == "videomae (pretraining)"
    x, mask = torch.randn(2, 3, 4, 32, 32), _tube_masks(2)
    with torch.no_grad():
        assert torch.equal(again(x, mask).loss, ours(x, mask).loss)
    hf2 = transformers.VideoMAEForPreTraining(_hf_pair()[0].config).eval()
    hf2.load_state_dict(to_hf(again), strict=True)  # and back out to Hugging Face's layout
    with torch.no_grad():
        ref = hf2(x.transpose(1, 2), bool_masked_pos=mask).loss
    assert abs(float(ref) - float(ours(x, mask).loss)) <= 1e-5 * float(ref)
    with pytest.raises(ValueError, match="not a VideoMAE pretraining checkpoint"):
        load_weights(again, {"foo.weight": torch.zeros(1)})


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_every_layout_gives_a_fine_tuning_model_the_same_encoder(pool: str) -> None:
    """VideoMAE's run_class_finetuning.py strips ``encoder.`` and loads non-strictly: the encoder's final
    token norm ``norm`` is used by a cls-pooling model and unused by a mean-pooling one, whose ``fc_norm``
    keeps LayerNorm's init. Every norm of the source is perturbed, so a norm left at its init cannot
    pass for a loaded one."""
    _, ours = _hf_pair()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in ours.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.add_(0.1 * torch.randn(m.weight.shape, generator=g))
                m.bias.add_(0.1 * torch.randn(m.bias.shape, generator=g))
    enc = dict(ours.encoder.named_parameters())
    token_norm = {"norm.weight": enc.pop("fc_norm.weight"), "norm.bias": enc.pop("fc_norm.bias")}
    loaded = {}
    for layout, source in (("avion_ds", ours.state_dict()), ("videomae", to_official(ours)), ("hf", to_hf(ours))):
        torch.manual_seed(2)  # the same fresh head / cls token
        ft = create_model("vit_test_tiny", pretrained=source, num_classes=10, pool=pool)
        params = dict(ft.named_parameters())
        for name, p in enc.items():
            torch.testing.assert_close(params[name], p, rtol=0, atol=0)
        if pool == "mean":
            assert torch.equal(params["fc_norm.weight"], torch.ones(64)), layout
            assert torch.equal(params["fc_norm.bias"], torch.zeros(64)), layout
        else:
            for name, p in token_norm.items():
                torch.testing.assert_close(params[name], p, rtol=0, atol=0)
        loaded[layout] = ft.state_dict()
    for layout in ("videomae", "hf"):
        assert all(torch.equal(v, loaded[layout][k]) for k, v in loaded["avion_ds"].items()), layout


def videomae_targets(videos: torch.Tensor, mask: torch.Tensor, t: int = 2, p: int = 16) -> torch.Tensor:
    """VideoMAE engine_for_pretraining.py, in float32: un-normalise (ImageNet mean / std), rearrange
    ``b c (t p0) (h p1) (w p2) -> b (t h w) (p0 p1 p2) c``, normalise each patch and channel by its
    mean and unbiased std + 1e-6, ``b n p c -> b n (p c)``, keep the masked tokens."""
    mean = torch.tensor((0.485, 0.456, 0.406))[None, :, None, None, None]
    std = torch.tensor((0.229, 0.224, 0.225))[None, :, None, None, None]
    v = videos.float() * std + mean
    b, c, T, H, W = v.shape
    v = v.reshape(b, c, T // t, t, H // p, p, W // p, p).permute(0, 2, 4, 6, 3, 5, 7, 1).reshape(b, -1, t * p * p, c)
    v = (v - v.mean(dim=-2, keepdim=True)) / (v.var(dim=-2, unbiased=True, keepdim=True).sqrt() + 1e-6)
    v = v.reshape(b, v.shape[1], -1)
    return v[mask].reshape(b, -1, v.shape[-1])


@torch.no_grad()
def test_bf16_model_computes_targets_from_float32_frames() -> None:
    """Nearly flat patches (8-bit levels a few steps apart) are where ``norm_pix_loss`` amplifies most:
    the targets must come from the float32 frames, the encoder runs in the model's bf16."""
    g = torch.Generator().manual_seed(0)
    levels = torch.randint(200, 250, (2, 3, 1, 1, 1), generator=g) + torch.randint(0, 4, (2, 3, 4, 32, 32), generator=g)
    mean = torch.tensor((0.485, 0.456, 0.406))[None, :, None, None, None]
    std = torch.tensor((0.229, 0.224, 0.225))[None, :, None, None, None]
    x = (levels.float() / 255 - mean) / std  # what the data pipeline hands the model, float32
    mask = _tube_masks(2)
    model = create_model("pretrain_videomae_test_tiny").to(torch.bfloat16).eval()
    out = model(x, mask)
    assert out.pred.dtype == torch.bfloat16 and out.target.dtype == torch.float32
    want = videomae_targets(x, mask)
    torch.testing.assert_close(out.target, want, rtol=1e-5, atol=1e-5)
    # the same clip cast to bf16 first (what a caller casting for the model would give) is far off
    assert float((videomae_targets(x.bfloat16(), mask) - want).abs().max()) > 0.1


def test_init_matches_official_videomae() -> None:
    """VideoMAE / V2 modeling_pretrain: the encoder's and decoder's ``apply`` xavier-initialise their
    linears; the top module never calls ``apply``, so ``encoder_to_decoder`` keeps nn.Linear's default
    U(+-1/sqrt(fan_in)); ``mask_token`` is trunc_normal_(std=.02) through their wrapper, truncated at
    a=-std, b=std."""
    torch.manual_seed(0)
    m = create_model("pretrain_videomae_test_tiny", decoder_dim=1024, decoder_heads=2)
    w = m.encoder_to_decoder.weight.detach()
    bound = 1 / math.sqrt(w.shape[1])  # kaiming_uniform_(a=sqrt(5)) bound
    assert bound * 0.99 < float(w.abs().max()) <= bound
    assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.03)
    tok = m.mask_token.detach().flatten()
    assert float(tok.abs().max()) <= 0.02
    phi, mass = math.exp(-0.5) / math.sqrt(2 * math.pi), math.erf(1 / math.sqrt(2))  # N(0,1) truncated at +-1
    assert float(tok.std()) == pytest.approx(0.02 * math.sqrt(1 - 2 * phi / mass), rel=0.08)
    head = m.decoder.head.weight.detach()  # the decoder's own linears stay xavier-uniform
    xavier = math.sqrt(6 / sum(head.shape))
    assert xavier * 0.99 < float(head.abs().max()) <= xavier
    assert torch.equal(m.decoder.norm.weight, torch.ones(1024)) and torch.equal(m.decoder.norm.bias, torch.zeros(1024))


def _official_v1_huge() -> dict:
    """The key / shape layout of a VideoMAE (V1) ViT-H/16 pretraining checkpoint, on the meta device:
    modeling_pretrain.py pretrain_videomae_huge_patch16_224 (encoder 1280 x 32, qkv_bias as q_bias /
    v_bias, decoder 640 wide x 4 (run_mae_pretraining's default depth), head 3 * 2 * 16 * 16)."""

    def t(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device="meta")

    def block(prefix: str, d: int) -> dict:
        return {
            f"{prefix}.norm1.weight": t(d),
            f"{prefix}.norm1.bias": t(d),
            f"{prefix}.attn.qkv.weight": t(3 * d, d),
            f"{prefix}.attn.q_bias": t(d),
            f"{prefix}.attn.v_bias": t(d),
            f"{prefix}.attn.proj.weight": t(d, d),
            f"{prefix}.attn.proj.bias": t(d),
            f"{prefix}.norm2.weight": t(d),
            f"{prefix}.norm2.bias": t(d),
            f"{prefix}.mlp.fc1.weight": t(4 * d, d),
            f"{prefix}.mlp.fc1.bias": t(4 * d),
            f"{prefix}.mlp.fc2.weight": t(d, 4 * d),
            f"{prefix}.mlp.fc2.bias": t(d),
        }

    sd = {"encoder.patch_embed.proj.weight": t(1280, 3, 2, 16, 16), "encoder.patch_embed.proj.bias": t(1280)}
    for i in range(32):
        sd.update(block(f"encoder.blocks.{i}", 1280))
    sd.update({"encoder.norm.weight": t(1280), "encoder.norm.bias": t(1280)})
    for i in range(4):
        sd.update(block(f"decoder.blocks.{i}", 640))
    sd.update(
        {
            "decoder.norm.weight": t(640),
            "decoder.norm.bias": t(640),
            "decoder.head.weight": t(1536, 640),
            "decoder.head.bias": t(1536),
            "encoder_to_decoder.weight": t(640, 1280),
            "mask_token": t(1, 1, 640),
        }
    )
    return {"model": sd}


def test_videomae_v1_huge_checkpoint_maps_on_the_meta_device() -> None:
    ckpt = _official_v1_huge()
    assert decoder_dims(ckpt["model"]) == {"decoder_dim": 640, "decoder_depth": 4}
    with torch.device("meta"):
        v1 = create_model("pretrain_videomae_v1_huge_patch16_224")
        from_file = create_model("pretrain_videomae_huge_patch16_224", pretrained=ckpt)  # decoder from the file
        v2 = create_model("pretrain_videomae_huge_patch16_224")
    report = load_weights(v1, ckpt, strict=True)  # every key mapped, every shape fits
    assert report.format == "videomae (pretraining)"
    for m in (v1, from_file):
        assert (m.arch.decoder_dim, m.arch.decoder_depth, m.arch.decoder_heads) == (640, 4, 8)
    assert {k: tuple(v.shape) for k, v in from_file.state_dict().items()} == {
        k: tuple(v.shape) for k, v in v1.state_dict().items()
    }
    with pytest.raises(ValueError, match=r"^checkpoint key decoder\..*decoder_dim=640") as e:
        load_weights(v2, ckpt)  # V2's 512-wide decoder: one line naming the key and the file's width
    assert "\n" not in str(e.value)


def test_decoder_width_and_depth_come_from_the_file(tmp_path) -> None:
    torch.manual_seed(0)
    src = create_model("pretrain_videomae_test_tiny", decoder_dim=48, decoder_depth=2).eval()
    path = tmp_path / "v1_style.pth"
    torch.save(to_official(src), path)
    for source in (str(path), to_hf(src), src.state_dict()):
        m = create_model("pretrain_videomae_test_tiny", pretrained=source)
        assert (m.arch.decoder_dim, m.arch.decoder_depth, m.arch.decoder_heads) == (48, 2, 2)
        assert all(torch.equal(v, m.state_dict()[k]) for k, v in src.state_dict().items())
    with pytest.raises(ValueError, match="decoder_dim=48"):  # an explicit width wins, and must fit
        create_model("pretrain_videomae_test_tiny", pretrained=str(path), decoder_dim=32)
    odd = to_official(create_model("pretrain_videomae_test_tiny", decoder_dim=33, decoder_heads=3))
    with pytest.raises(ValueError, match="33 wide decoder, not divisible by 2 heads; pass decoder_heads="):
        create_model("pretrain_videomae_test_tiny", pretrained=odd)
    assert create_model("pretrain_videomae_test_tiny", pretrained=odd, decoder_heads=3).arch.decoder_dim == 33


def _same_params(a: torch.nn.Module, b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(p, b[n]) for n, p in a.named_parameters())


def test_public_loader_dispatches_on_the_model() -> None:
    """``load_weights`` given a pretraining model loads a Hugging Face ``VideoMAEForPreTraining`` state
    dict as ``create_model(pretrained=...)`` does; a fine-tuning model given it takes the encoder."""
    hf, _ = _hf_pair()
    sd = hf.state_dict()
    ref = dict(create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5, pretrained=sd).named_parameters())
    m = create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5)
    report = load_weights(m, sd)
    assert report.format == "hf (pretraining)" and report.mean_std == "imagenet"
    assert not report.missing and not report.unexpected, report.summary()
    assert _same_params(m, ref)
    ft = create_model("vit_test_tiny", num_classes=3)
    assert load_weights(ft, sd).format == "hf"
    assert torch.equal(ft.blocks[1].mlp.fc2.weight, ref["encoder.blocks.1.mlp.fc2.weight"])
    with pytest.raises(TypeError, match="^pretrained weights load into a VideoViT or a VideoMAEPretrain, got Linear"):
        load_weights(torch.nn.Linear(2, 2), sd)


def test_sharded_load_into_a_partitioned_pretraining_model(one_rank: None) -> None:
    from avion_ds.distributed import dist
    from avion_ds.models.partition import gathered
    from avion_ds.models.weights.loading import build_partitioned

    dist.init()
    hf, ours = _hf_pair()
    zero3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    part = build_partitioned(
        lambda: create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5),
        zero3,
        pretrained=hf.state_dict(),
        strict=True,
    )
    full = {}
    for n, p in part.named_parameters():
        with gathered([p], modifier_rank=None):
            full[n] = p.data.clone()
    assert _same_params(ours, full)


def test_zero_key_biases_some_transformers_versions_store_are_skipped_and_others_refused() -> None:
    """transformers 5.17's VideoMAE stores ``attention.attention.key.bias`` (zeros): the same function as
    VideoMAE's key without bias, so it loads strictly with the keys named skipped; a non-zero one is refused."""
    hf, ours = _hf_pair()
    sd = dict(hf.state_dict())
    for k in [k for k in sd if k.endswith("attention.attention.query.bias")]:
        sd[k.replace("query.bias", "key.bias")] = torch.zeros_like(sd[k])
    m = create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5)
    report = load_weights(m, sd, strict=True)
    assert len(report.skipped) == 3 and all(k.endswith("key.bias") for k in report.skipped), report.skipped
    assert any("zero key biases" in n for n in report.notes)
    assert _same_params(m, dict(ours.named_parameters()))
    bad = next(k for k in sd if k.endswith("key.bias"))
    sd[bad] = torch.full_like(sd[bad], 0.5)
    with pytest.raises(ValueError, match=rf"^HF checkpoint: {bad} is not zero"):
        load_weights(create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5), sd)

"""VideoMAE pretraining model: sizes, loss against Hugging Face ``VideoMAEForPreTraining`` (random
weights, loaded both ways), V2 dual masking, and every checkpoint layout into pretraining and
fine-tuning models."""

from __future__ import annotations

import pytest
import torch

from avion_ds.data.masking import MaskSpec
from avion_ds.models import count_params, create_model, load_pretrained_mae
from avion_ds.models.pretrained_mae import detect_mae_format, to_hf, to_official

transformers = pytest.importorskip("transformers")

SIZES = {  # name: (encoder dim, depth, decoder dim, decoder heads, pixels per token)
    "pretrain_videomae_small_patch16_224": (384, 12, 192, 3, 1536),
    "pretrain_videomae_base_patch16_224": (768, 12, 384, 6, 1536),
    "pretrain_videomae_large_patch16_224": (1024, 24, 512, 8, 1536),
    "pretrain_videomae_huge_patch16_224": (1280, 32, 512, 8, 1536),
    "pretrain_videomae_giant_patch14_224": (1408, 40, 512, 8, 1176),
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_registered_sizes(name: str) -> None:
    dim, depth, ddim, dheads, pix = SIZES[name]
    with torch.device("meta"):
        m = create_model(name)
        ft = create_model(name.replace("pretrain_videomae_", "vit_"), num_classes=0)
    assert (m.encoder.embed_dim, m.encoder.depth, m.arch.decoder_dim, m.arch.decoder_heads) == (dim, depth, ddim, dheads)
    assert len(m.decoder.blocks) == 4 and m.decoder.head.out_features == pix
    assert m.encoder_to_decoder.bias is None and m.mask_token.shape == (1, 1, ddim)
    # the encoder IS the fine-tuning ViT (no head): same parameter count
    assert count_params(m.encoder) == count_params(ft)


def _hf_pair(norm_pix: bool = True, **cfg):
    """A random-weight HF VideoMAEForPreTraining and our tiny model holding its weights."""
    config = transformers.VideoMAEConfig(
        image_size=32, patch_size=16, num_frames=4, tubelet_size=2, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=256, decoder_hidden_size=32, decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2, decoder_intermediate_size=128, norm_pix_loss=norm_pix, layer_norm_eps=1e-6,
        use_mean_pooling=False, attn_implementation="sdpa", **cfg)
    torch.manual_seed(0)
    hf = transformers.VideoMAEForPreTraining(config).eval()
    # Hugging Face's decoder LayerNorm keeps PyTorch's eps (1e-5); the official code uses 1e-6
    ours = create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5, norm_pix_loss=norm_pix).eval()
    report = load_pretrained_mae(ours, hf.state_dict(), strict=True)
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
            want.append(float(hf(x[b:b + 1].transpose(1, 2), bool_masked_pos=single).loss))
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
    assert "encoder.norm.weight" in official["model"] and official["model"]["encoder.patch_embed.proj.weight"].dim() == 5
    assert detect_mae_format(official["model"]) == "videomae"
    assert detect_mae_format(ours.state_dict()) == "avion_ds"
    again = create_model("pretrain_videomae_test_tiny", decoder_norm_eps=1e-5).eval()
    assert load_pretrained_mae(again, official, strict=True).format == "videomae (pretraining)"
    x, mask = torch.randn(2, 3, 4, 32, 32), _tube_masks(2)
    with torch.no_grad():
        assert torch.equal(again(x, mask).loss, ours(x, mask).loss)
    hf2 = transformers.VideoMAEForPreTraining(_hf_pair()[0].config).eval()
    hf2.load_state_dict(to_hf(again), strict=True)  # and back out to Hugging Face's layout
    with torch.no_grad():
        ref = hf2(x.transpose(1, 2), bool_masked_pos=mask).loss
    assert abs(float(ref) - float(ours(x, mask).loss)) <= 1e-5 * float(ref)
    with pytest.raises(ValueError, match="not a VideoMAE pretraining checkpoint"):
        load_pretrained_mae(again, {"foo.weight": torch.zeros(1)})


@pytest.mark.parametrize("layout", ["avion_ds", "videomae", "hf"])
def test_fine_tuning_model_takes_the_encoder(layout: str) -> None:
    _, ours = _hf_pair()
    source = {"avion_ds": ours.state_dict(), "videomae": to_official(ours), "hf": to_hf(ours)}[layout]
    ft = create_model("vit_test_tiny", pretrained=source, num_classes=10).eval()
    enc = ours.encoder
    for name, p in enc.named_parameters():  # every encoder weight, incl. the token norm -> fc_norm
        if not name.startswith("head"):
            torch.testing.assert_close(dict(ft.named_parameters())[name], p, rtol=0, atol=0)
    x = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ft.forward_features(x), enc.forward_features(x))

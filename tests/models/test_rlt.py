"""Run-length tokenization: keep mask, run lengths, length embedding and packed attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from avion_ds.models.rlt import (
    RunLengthEmbedding,
    pack_kept,
    packed_attention,
    run_lengths,
    static_keep_mask,
    threshold_problem,
)


def reference_rlt(frames: torch.Tensor, tubelet: int, patch: int, threshold: float):
    """The reference's rule, patch by patch: keep when the mean |difference| to the previous tubelet's
    patch is at least ``threshold``; a dropped patch adds one to the last kept patch's run."""
    b, _c, t, h, w = frames.shape
    nt, nh, nw = t // tubelet, h // patch, w // patch
    keep = torch.zeros(b, nt, nh, nw, dtype=torch.bool)
    lengths = torch.zeros(b, nt, nh, nw, dtype=torch.long)
    x = frames.float() / 255.0
    for i in range(b):
        for y in range(nh):
            for z in range(nw):
                last = 0
                for s in range(nt):
                    cur = x[
                        i, :, s * tubelet : (s + 1) * tubelet, y * patch : (y + 1) * patch, z * patch : (z + 1) * patch
                    ]
                    if s > 0:
                        prev = x[
                            i,
                            :,
                            (s - 1) * tubelet : s * tubelet,
                            y * patch : (y + 1) * patch,
                            z * patch : (z + 1) * patch,
                        ]
                        if (cur - prev).abs().mean() < threshold:
                            lengths[i, last, y, z] += 1
                            continue
                    keep[i, s, y, z] = True
                    lengths[i, s, y, z] = 1
                    last = s
    return keep, lengths


def _clip(b: int, t: int, size: int = 8, seed: int = 0) -> torch.Tensor:
    """uint8 clips where some patches repeat the previous tubelet (the same pixels) and others change."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (b, 3, t, size, size), generator=g, dtype=torch.uint8)
    static = torch.rand(b, t, size // 4, size // 4, generator=g) < 0.5
    for s in range(2, t):
        for y in range(size // 4):
            for z in range(size // 4):
                for i in range(b):
                    if static[i, s, y, z]:
                        frames[i, :, s, y * 4 : y * 4 + 4, z * 4 : z * 4 + 4] = frames[
                            i, :, s - 2, y * 4 : y * 4 + 4, z * 4 : z * 4 + 4
                        ]
    return frames


@pytest.mark.parametrize("t", [8, 9, 7])
def test_keep_mask_and_run_lengths_match_the_reference_rule(t: int) -> None:
    frames = _clip(2, t)
    keep = static_keep_mask(frames, tubelet=2, patch=4, threshold=0.1)
    ref_keep, ref_len = reference_rlt(frames, 2, 4, 0.1)
    assert keep.shape == (2, t // 2, 2, 2)
    assert torch.equal(keep, ref_keep)
    assert torch.equal(run_lengths(keep), ref_len)
    assert 0 < int(keep.sum()) < keep.numel()  # the clip has both kinds of patch
    assert int(run_lengths(keep).sum(dim=1).min()) == t // 2  # runs cover every tubelet


def test_a_clip_with_no_static_patch_keeps_everything_with_runs_of_one() -> None:
    frames = torch.randint(0, 256, (1, 3, 8, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    keep = static_keep_mask(frames, 2, 4, 0.1)
    assert bool(keep.all())
    assert bool((run_lengths(keep) == 1).all())


def test_a_clip_static_after_its_first_tubelet_keeps_only_the_first() -> None:
    frames = torch.randint(0, 256, (1, 3, 2, 8, 8), dtype=torch.uint8).repeat(1, 1, 4, 1, 1)
    keep = static_keep_mask(frames, 2, 4, 0.1)
    assert bool(keep[:, 0].all()) and not bool(keep[:, 1:].any())
    lengths = run_lengths(keep)
    assert bool((lengths[:, 0] == 4).all()) and bool((lengths[:, 1:] == 0).all())


def test_the_zero_initialised_length_embedding_leaves_tokens_bit_for_bit() -> None:
    tokens = torch.randn(2, 5, 16)
    out = RunLengthEmbedding(8, 16)(tokens, torch.randint(1, 9, (2, 5)))
    assert torch.equal(out, tokens)


def test_packed_attention_equals_padded_attention_with_a_key_mask() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 10, 2, 8, generator=g)  # (B, N, heads, head_dim)
    keep = torch.rand(3, 10, generator=g) > 0.4
    keep[:, 0] = True
    packed = pack_kept(x, keep).transpose(1, 2)
    out = packed_attention(packed, packed, packed).transpose(1, 2)
    for i in range(3):
        q = x[i][keep[i]].transpose(0, 1).unsqueeze(0)  # one clip, no padding
        want = F.scaled_dot_product_attention(q, q, q)[0].transpose(0, 1)
        padded = x[i].transpose(0, 1).unsqueeze(0)
        masked = F.scaled_dot_product_attention(padded, padded, padded, attn_mask=keep[i][None])[0].transpose(0, 1)
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[i], masked[keep[i]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "value,ok", [(0, True), (0.1, True), (0.999, True), (1.0, False), (-0.1, False), (True, False), ("0.1", False)]
)
def test_threshold_problem(value: object, ok: bool) -> None:
    assert (threshold_problem(value) is None) == ok

"""Run-length tokenization building blocks: the keep rule and run lengths against the reference code's
(github rccchoudhury/rlt, ``src/models/static_token_utils.py``, ported below), the length embedding, the
packed layout and packed attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from avion_ds.models.attention import packed_attention
from avion_ds.models.rlt import (
    IMAGENET_STD,
    PackedClips,
    RunLengthEmbedding,
    run_lengths,
    static_keep_mask,
    threshold_problem,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)


def reference_keep(x: torch.Tensor, tubelet: int, patch: int, threshold: float) -> torch.Tensor:
    """``batched_find_idxs_to_keep`` of the reference on a normalised clip (B, C, T, H, W) -> (B, T', H', W').

    The reference slices ``x[:, :, 2t-1::t] - x[:, :, :-t:t]``, which fails on a clip with trailing frames
    that do not fill a tubelet; the clip is cut to whole tubelets first (the patch embedding ignores them)."""
    t = x.shape[2] // tubelet * tubelet
    x = x[:, :, :t].type(torch.float32)
    diffs = torch.abs(x[:, :, (2 * tubelet - 1) :: tubelet] - x[:, :, :-tubelet:tubelet])
    blocks = torch.mean(F.avg_pool3d(diffs, (1, patch, patch)), dim=1, keepdim=True)
    first = torch.ones_like(blocks[:, :, 0:1]) * 255
    return (torch.cat([first, blocks], dim=2).squeeze(1) > threshold).reshape(x.shape[0], t // tubelet, -1)


def reference_lengths(keep: torch.Tensor) -> torch.Tensor:
    """``batched_get_token_lengths`` of the reference: the run length of each kept token of ``keep``
    (B, T', H', W'), in the reference's order (batch, row, column, time; its tokens are time-major)."""
    x = keep.permute(0, 2, 3, 1)
    b, h, w, t = x.shape
    padded = torch.cat([x.to(torch.uint8), torch.ones((b, h, w, 1), dtype=torch.uint8)], dim=-1)
    index = torch.arange(t + 1).reshape(1, 1, 1, t + 1).repeat(b, h, w, 1)
    diffs = index[padded.bool()].diff()
    return diffs[diffs > 0]


def piecewise_static(
    b: int, t: int, size: int = 32, patch: int = 16, seed: int = 0, p_static: float = 0.5
) -> torch.Tensor:
    """uint8 clips (B, 3, T, size, size) whose patches either repeat the previous frame's exactly (with
    probability ``p_static``) or change to new random pixels (static backgrounds and moving parts)."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (b, 3, t, size, size), generator=g, dtype=torch.uint8)
    n = size // patch
    static = torch.rand(b, t, n, n, generator=g) < p_static
    for i in range(b):
        for f in range(1, t):
            for y in range(n):
                for z in range(n):
                    if static[i, f, y, z]:
                        rows, cols = slice(y * patch, (y + 1) * patch), slice(z * patch, (z + 1) * patch)
                        frames[i, :, f, rows, cols] = frames[i, :, f - 1, rows, cols]
    return frames


def normalised(frames: torch.Tensor) -> torch.Tensor:
    """The reference's transform: ``ToDtype(float32, scale=True)`` then ImageNet ``Normalize``."""
    x = frames.float() / 255.0
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
    return (x - mean) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)


@pytest.mark.parametrize("t,tubelet", [(8, 2), (9, 2), (7, 2), (5, 1), (12, 3)])
def test_keep_mask_and_run_lengths_match_the_reference(t: int, tubelet: int) -> None:
    frames = piecewise_static(3, t, seed=t)
    x = normalised(frames)
    want = reference_keep(x, tubelet, 16, 0.1)
    keep = static_keep_mask(x, tubelet=tubelet, patch=16, threshold=0.1)
    assert keep.shape == (3, t // tubelet, 2, 2)
    assert torch.equal(keep.flatten(2), want)
    assert torch.equal(static_keep_mask(frames, tubelet, 16, 0.1), keep)  # uint8: scaled by the std
    assert 0 < int(keep[:, 1:].sum()) < keep[:, 1:].numel()  # the clips have both kinds of patch
    lengths = run_lengths(keep)
    assert torch.equal(lengths.permute(0, 2, 3, 1)[keep.permute(0, 2, 3, 1)], reference_lengths(keep))
    assert bool((lengths.sum(dim=1) == t // tubelet).all())  # runs cover every tubelet


def test_a_difference_equal_to_the_threshold_is_dropped() -> None:
    """The reference keeps a patch whose difference is ABOVE the threshold; equal is static."""
    x = torch.zeros(1, 3, 4, 16, 16)
    x[:, :, 3] = 0.25  # the last frame of tubelet 1 minus the first of tubelet 0: exactly 0.25
    assert reference_keep(x, 2, 16, 0.25).flatten().tolist() == [True, False]
    assert static_keep_mask(x, 2, 16, 0.25).flatten().tolist() == [True, False]
    assert static_keep_mask(x, 2, 16, 0.2499).flatten().tolist() == [True, True]


def test_the_rule_compares_the_last_frame_with_the_previous_tubelets_first() -> None:
    """A change inside tubelet 0 only (frame 1) is not measured; a change at frame 3 is."""
    x = torch.zeros(1, 3, 4, 16, 16)
    x[:, :, 1] = 1.0
    assert static_keep_mask(x, 2, 16, 0.1).flatten().tolist() == [True, False]
    x = torch.zeros(1, 3, 4, 16, 16)
    x[:, :, 3] = 1.0
    assert static_keep_mask(x, 2, 16, 0.1).flatten().tolist() == [True, True]


def test_a_clip_static_after_its_first_tubelet_keeps_only_the_first() -> None:
    frames = torch.randint(0, 256, (1, 3, 1, 32, 32), dtype=torch.uint8).repeat(1, 1, 8, 1, 1)
    keep = static_keep_mask(frames, 2, 16, 0.1)
    assert bool(keep[:, 0].all()) and not bool(keep[:, 1:].any())
    lengths = run_lengths(keep)
    assert bool((lengths[:, 0] == 4).all()) and bool((lengths[:, 1:] == 0).all())


def test_the_zero_initialised_length_embedding_leaves_tokens_bit_for_bit() -> None:
    tokens = torch.randn(2, 5, 16)
    out = RunLengthEmbedding(8, 16)(tokens, torch.randint(1, 9, (2, 5)))
    assert torch.equal(out, tokens)


def test_packed_layout_and_per_clip_mean() -> None:
    keep = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    packed = PackedClips.from_keep(keep)
    assert packed.offsets.tolist() == [0, 2, 3, 6] and packed.clip.tolist() == [0, 0, 1, 2, 2, 2]
    assert packed.lengths == (2, 1, 3) and packed.max_len == 3
    x = torch.randn(6, 4)
    want = torch.stack([x[0:2].mean(0), x[2:3].mean(0), x[3:6].mean(0)])
    torch.testing.assert_close(packed.mean(x), want)


def test_packed_attention_equals_each_clip_alone_and_padded_attention_with_a_key_mask() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 10, 2, 8, generator=g)  # (B, N, heads, head_dim)
    keep = torch.rand(3, 10, generator=g) > 0.4
    keep[:, 0] = True
    packed = PackedClips.from_keep(keep)
    qkv = x[keep].unsqueeze(1).expand(-1, 3, -1, -1)  # q = k = v
    out = packed_attention(qkv, packed.offsets, packed.max_len, "sdpa", packed.lengths)  # (total, heads * d)
    for i in range(3):
        q = x[i][keep[i]].transpose(0, 1).unsqueeze(0)  # one clip, no padding
        want = F.scaled_dot_product_attention(q, q, q)[0].transpose(0, 1).flatten(1)
        padded = x[i].transpose(0, 1).unsqueeze(0)
        masked = F.scaled_dot_product_attention(padded, padded, padded, attn_mask=keep[i][None])[0]
        got = out[packed.offsets[i] : packed.offsets[i + 1]]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, masked.transpose(0, 1)[keep[i]].flatten(1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "value,ok", [(0, True), (0.1, True), (0.999, True), (1.0, False), (-0.1, False), (True, False), ("0.1", False)]
)
def test_threshold_problem(value: object, ok: bool) -> None:
    assert (threshold_problem(value) is None) == ok

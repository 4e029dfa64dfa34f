"""Saved-for-backward bytes of a video transformer that merges tokens (``model.token_merge``).

A merging block (``models/vit/model.py`` ``Block.forward_merging``) runs its attention on the ``n``
tokens it receives, merges ``r`` of them (``models/token_merge.py``), then runs its MLP on ``n - r``.
What autograd keeps, per clip, with element size s (fp32 sizes stay fp32, 4 bytes):

    attention on n tokens       n (s (6 D + 2) + 4 H) [+ n D s LayerScale]   (as a plain block's)
                                [+ n s: the log-size bias sdpa keeps, once some earlier block merged]
    merge of r tokens           16 ceil(n/2) + 8 int64 indices: the matching's order, the kept A tokens,
                                                 the r destinations (|A| + (|A| - r) + r) and the rows
                                + floor(n/2) s   the B sizes the size-weighted average divides by
                                + the sizes x is multiplied by (below)
    MLP on n - r tokens         (n - r) s (2 D + F + 2) [+ (n - r) D s LayerScale]

A checkpointed block keeps its input tokens (n D s) and its input sizes (4 n, fp32), and under the
``selective`` policy also what that policy caches (on n tokens: q/k/v, attention output, the
log-sum-exp; and, when it merges, the matching's similarity matrix, a batched matmul: ceil(n/2) floor(n/2) s).

Sizes: each merging block makes a new float32 size tensor; the blocks after it read it until the next
merge. It is kept once as is (4 n) when a checkpointed block takes it as input, or, in fp32, when the
next merge or the size-weighted mean pooling multiplies by it; in 16-bit each multiply keeps its own
cast copy (2 n). The first merge multiplies by fresh ones (n s). Mean pooling also keeps its
denominator (s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from avion_ds.models.token_merge import merge_schedule


def tokens_per_block(tokens: int, schedule: list[int]) -> list[int]:
    """Tokens entering each block, then the tokens after the last one (``len(schedule) + 1`` counts)."""
    counts = [tokens]
    for r in schedule:
        counts.append(counts[-1] - r)
    return counts


def _attention_part(info: Any, n: int, s: int, backend: str) -> int:
    """A block's attention half on ``n`` tokens (LN1, q/k/v, attention and its output, LayerScale)."""
    d, h = info.embed_dim, info.num_heads
    part = n * (s * (6 * d + 2) + (d * s if info.layer_scale else 0))
    if backend == "eager":
        return part + n * d * s + h * n * n * (4 + (s if s != 4 else 0))
    return part + 4 * h * n


def _mlp_part(info: Any, m: int, s: int) -> int:
    """A block's MLP half on ``m`` tokens (LN2, fc1 input, GELU input, LayerScale)."""
    d = info.embed_dim
    return m * (s * (2 * d + info.mlp_hidden + 2) + (d * s if info.layer_scale else 0))


def merging_block_bytes(info: Any, n: int, r: int, s: int, backend: str = "sdpa", sized: bool = False) -> int:
    """Saved bytes of ONE un-checkpointed block of a merging model for one clip, sizes aside (the
    table above): ``n`` tokens in, ``r`` merged; ``sized``: an earlier block merged (a logit bias)."""
    total = _attention_part(info, n, s, backend) + _mlp_part(info, n - r, s)
    if sized and backend != "eager":
        total += n * s  # sdpa keeps its attn_mask (eager adds the bias, keeping nothing)
    if r:
        total += 16 * ((n + 1) // 2) + 8 + (n // 2) * s
    return total


def merging_blocks_bytes(
    info: Any,
    tokens: int,
    s: int,
    backend: str,
    checkpointed: set[int],
    ckpt_bytes: Callable[[int], int],
    selective: bool = False,
) -> int:
    """Saved bytes of every block of a merging model for one clip, the sizes' and the size-weighted mean
    pooling's included. ``info.token_merge``: the schedule; ``checkpointed``: the checkpointed block
    indices; ``ckpt_bytes(n)``: what a checkpointed block on ``n`` tokens keeps under the policy
    (``estimate.checkpointed_block_bytes``); ``selective``: that policy, which also keeps the similarity
    of the blocks that merge."""
    schedule = merge_schedule(list(info.token_merge), info.depth)
    counts = tokens_per_block(tokens, schedule)
    total, sized = 0, False
    readers: list[tuple[bool, bool]] = []  # the current size tensor's readers: (kept as is, copied in 16 bit)
    size_tokens = 0

    def close() -> int:  # the bytes kept of the size tensor whose readers are done
        kept_as_is = any(a for a, _ in readers)
        copies = sum(c for _, c in readers)
        if s == 4:
            return 4 * size_tokens if kept_as_is or copies else 0
        return 4 * size_tokens * kept_as_is + 2 * size_tokens * copies

    for i, r in enumerate(schedule):
        n = counts[i]
        if i in checkpointed:
            total += ckpt_bytes(n) + (((n + 1) // 2) * (n // 2) * s if selective and r else 0)
            if sized:
                readers.append((True, False))
        else:
            total += merging_block_bytes(info, n, r, s, backend, sized)
            if r and sized:
                readers.append((False, True))
            elif r:
                total += n * s  # the first merge multiplies by fresh ones
        if r:
            total += close() if sized else 0
            readers, size_tokens, sized = [], counts[i + 1], True
    if sized and info.pool != "cls":
        readers.append((False, True))  # the size-weighted mean
        total += s  # its denominator
    return total + (close() if sized else 0)

"""Token merging (ToMe, Bolya et al., ICLR 2023): fewer tokens after each block, no retraining needed.

After a block's attention, bipartite soft matching merges ``r`` tokens: the tokens are split
alternately into sets A (even positions) and B (odd positions); each A token's most similar B token
is found by the cosine similarity of the keys (averaged over heads); the ``r`` A tokens with the most
similar match are merged into it by a size-weighted average, and sizes (how many input tokens each
token stands for) add up. A class token (position 0, in A) is never merged. Later attention is
proportional: ``log(size)`` of each key is added to the logits, so a merged token weighs as the
tokens it replaced. Video tokens are one sequence, so merging runs across space and time.

The schedule (``token_merge``) is an int ``r`` for every block or a list with one ``r`` per block;
0 is off.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def merge_schedule(token_merge: int | Sequence[int], depth: int) -> list[int]:
    """The ``r`` of each of ``depth`` blocks (a list is taken as is; check it with ``schedule_problem``)."""
    if isinstance(token_merge, int):
        return [int(token_merge)] * depth
    return [int(r) for r in token_merge]


def max_merge(tokens: int, class_token: bool) -> int:
    """The most tokens one bipartite merge can remove from ``tokens``: every A token but the class token,
    and none when B is empty."""
    if tokens < 2:
        return 0
    return (tokens + 1) // 2 - int(class_token)


def schedule_problem(token_merge: object, depth: int, tokens: int, class_token: bool) -> str | None:
    """Why ``token_merge`` cannot run on ``depth`` blocks starting from ``tokens`` tokens, or None."""
    if isinstance(token_merge, bool) or not isinstance(token_merge, (int, list, tuple)):
        return "expected an int r or a list of r per block"
    if not isinstance(token_merge, int):
        if any(isinstance(r, bool) or not isinstance(r, int) for r in token_merge):
            return "expected a list of integers"
        if len(token_merge) != depth:
            return f"a schedule of {len(token_merge)} blocks, the model has depth {depth}"
    left = tokens
    for i, r in enumerate(merge_schedule(token_merge, depth)):
        if r < 0:
            return f"block {i}: r={r} is negative"
        most = max_merge(left, class_token)
        if r > most:
            return f"block {i}: r={r} but it can merge at most {most} of its {left} tokens"
        left -= r
    return None


def merge_tokens(
    x: torch.Tensor, size: torch.Tensor | None, keys: torch.Tensor, r: int, class_token: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``r`` tokens of ``x`` (B, N, D) by bipartite soft matching on ``keys`` (B, N, C).

    ``size`` (B, N, 1) float32 or None (all ones). Returns the merged tokens (B, N - r, D) and their sizes
    (B, N - r, 1), float32 whatever ``x``'s dtype (bf16 counts integers exactly only to 256): the A tokens
    left unmerged in their order (a class token stays first), then B. Ties go to the lowest index (best
    match and the order of the edges).
    """
    B, N, D = x.shape
    if size is None:
        size = torch.ones(B, N, 1, dtype=torch.float32, device=x.device)
    with torch.no_grad():  # the matching picks indices; gradients flow through the merge only
        metric = keys / keys.norm(dim=-1, keepdim=True)
        scores = metric[:, 0::2] @ metric[:, 1::2].transpose(1, 2)  # (B, |A|, |B|)
        if class_token:
            scores[:, 0] = float("-inf")
        best, match = scores.max(dim=-1)  # each A token's most similar B token
        order = torch.sort(best, dim=-1, descending=True, stable=True).indices
        src, keep = order[:, :r], order[:, r:].sort(dim=-1).values  # merged A tokens, the rest in order
        dst = match.gather(1, src)  # (B, r): the B token each merges into

    # picking tokens by indexing keeps only the indices for backward (gather would keep its whole input)
    rows = torch.arange(B, device=x.device)[:, None]
    weighted = x * size.to(x.dtype)
    a_w, b_w, a_s, b_s = weighted[:, 0::2], weighted[:, 1::2], size[:, 0::2], size[:, 1::2]
    b_w = b_w.scatter_add(1, dst[..., None].expand(-1, -1, D), a_w[rows, src])
    b_s = b_s.scatter_add(1, dst[..., None], a_s.gather(1, src[..., None]))
    a_x = x[:, 0::2][rows, keep]
    a_s = a_s.gather(1, keep[..., None])
    merged = torch.cat((a_x, b_w / b_s.to(x.dtype)), dim=1)
    return merged, torch.cat((a_s, b_s), dim=1)


def size_bias(size: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Proportional attention's logit bias (B, 1, 1, N): ``log(size)`` of each key, in ``dtype``."""
    return size.log().to(dtype).transpose(1, 2).unsqueeze(1)


def weighted_mean(x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """Mean over tokens (B, N, D) -> (B, D), each token counted ``size`` times (merged tokens' weight)."""
    return (x * size.to(x.dtype)).sum(dim=1) / size.sum(dim=1).to(x.dtype)

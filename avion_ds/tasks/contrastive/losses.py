"""AVION's contrastive loss (``ClipLoss``, default mode) and the feature cache that makes gradient
accumulation a bigger batch (the MIR fine-tuning loss is ``avion_ds.tasks.mir.losses``).

:func:`clip_loss` is ``avion/losses/losses.py``'s ``ClipLoss`` with ``local_loss=False,
gather_with_grad=True``: both embeddings are all-gathered WITH gradient (``torch.distributed.nn``),
every rank builds the global N x N logits ``scale * V T^T`` with labels ``arange(N)`` and takes the
symmetric cross-entropy. Every rank computes the same loss, so the logged mean over ranks is that
loss; the gather's backward sums every rank's gradient into each rank's own rows and DeepSpeed's
gradient average turns that back into the gradient of the one global loss. Logged beside it:
``clip_acc`` (video->text top-1 in percent, AVION's definition), ``t2v_acc`` (text->video top-1)
and ``logit_scale``. The logits and the loss are computed in float32 (or the embeddings' wider dtype).

:func:`feature_cache_losses` is the scheme AVION's accumulation branch intended (its code uses
undefined names and never ran; GradCache, Gao et al. 2021): embed every micro-batch of the window
without gradient, then for each micro-batch recompute its embeddings with gradient, put them in
place of their cached copies and yield the loss over the WHOLE window. Each backward gives the
window loss's gradient through that micro-batch's embeddings; their sum is the gradient of one
batch of micro x accum clips, so the backwards must not be divided by the accumulation steps. The
temperature enters with gradient once per window. The random state (dropout, drop path) is
replayed so the recomputed embeddings equal the cached ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from avion_ds.models.clip.model import at_least_fp32

LossParts = tuple[Tensor, dict[str, Tensor]]
# micro-batch i -> (video embeddings (b, E), text embeddings (b, E), logit scale (0-d)); normalised
Encode = Callable[[int], tuple[Tensor, Tensor, Tensor]]


def gather_with_grad(x: Tensor) -> Tensor:
    """Rows of ``x`` from every rank, concatenated in rank order, differentiable (one rank: ``x``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    import torch.distributed.nn.functional as dist_nn  # lazy: optional (a build without distributed)

    with warnings.catch_warnings():  # its suggested replacement has no gradient to the other ranks' rows
        warnings.filterwarnings("ignore", message=".*all_gather is deprecated", category=FutureWarning)
        return torch.cat(dist_nn.all_gather(x.contiguous()), dim=0)


def clip_loss(video: Tensor, text: Tensor, logit_scale: Tensor) -> LossParts:
    """AVION's ClipLoss (global logits over every rank's rows, symmetric cross-entropy) and its
    logged values; ``video`` / ``text`` are this rank's normalised embeddings."""
    all_video, all_text = gather_with_grad(at_least_fp32(video)), gather_with_grad(at_least_fp32(text))
    logits = at_least_fp32(logit_scale) * all_video @ all_text.T
    labels = torch.arange(logits.shape[0], device=logits.device)
    loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    with torch.no_grad():
        clip_acc = 100.0 * (logits.argmax(dim=-1) == labels).float().mean()
        t2v_acc = 100.0 * (logits.argmax(dim=0) == labels).float().mean()
    return loss, {"clip_acc": clip_acc, "t2v_acc": t2v_acc, "logit_scale": logit_scale.detach().float().reshape(())}


def _rng_state() -> dict[str, Any]:
    from deepspeed.accelerator import get_accelerator  # lazy: heavy (deepspeed)

    acc = get_accelerator()
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if acc.device_name() != "cpu":
        state["device"] = acc.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from deepspeed.accelerator import get_accelerator  # lazy: heavy (deepspeed)

    torch.set_rng_state(state["cpu"])
    if "device" in state:
        get_accelerator().set_rng_state(state["device"])


def feature_cache_losses(
    encode: Encode, micro_batches: int, loss_fn: Callable[[Tensor, Tensor, Tensor], LossParts] = clip_loss
) -> Iterator[LossParts]:
    """One loss per micro-batch, each over the whole window (see module doc); yield before backward.

    With one micro-batch this is ``loss_fn(*encode(0))`` (no cache pass)."""
    if micro_batches == 1:
        yield loss_fn(*encode(0))
        return
    states, videos, texts = [], [], []
    with torch.no_grad():
        for i in range(micro_batches):
            states.append(_rng_state())
            v, t, _ = encode(i)
            videos.append(v)
            texts.append(t)
    for i in range(micro_batches):
        _set_rng_state(states[i])
        v, t, scale = encode(i)
        video = torch.cat([*videos[:i], v, *videos[i + 1 :]])
        text = torch.cat([*texts[:i], t, *texts[i + 1 :]])
        # the temperature's gradient once per window (each backward would add it again)
        yield loss_fn(video, text, scale if i == micro_batches - 1 else scale.detach())

"""AVION's EPIC-100 MIR fine-tuning loss (``MaxMarginRankingLoss``), over every rank's rows.

:func:`max_margin_loss` is ``MaxMarginRankingLoss(margin=0.2, fix_norm=True)`` as AVION's
``scripts/main_lavila_finetune_mir.py`` builds it (lines 155-162, ``gather_with_grad=True``): the same
gathered features, their cosine similarity ``s[i, j]`` of text i and video j (``sim_matrix``: each row
divided by max(norm, 1e-8)), and the hinge ``relu(margin - s[i, i] + s[i, j])`` for every text's
negative videos plus ``relu(margin - s[i, i] + s[j, i])`` for every video's negative texts, averaged
over those 2n(n-1) off-diagonal terms. The temperature takes no part (AVION freezes it), and neither
does the caption's relevancy: AVION passes it as ``weight`` and its ``forward`` never reads it; we
do the same (unweighted). Logged: ``clip_acc`` and ``t2v_acc`` from ``s`` as above.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from avion_ds.models.clip.model import at_least_fp32
from avion_ds.tasks.contrastive.losses import LossParts, gather_with_grad

MIR_MARGIN = 0.2  # AVION scripts/main_lavila_finetune_mir.py line 156


def max_margin_loss(video: Tensor, text: Tensor, logit_scale: Tensor, margin: float = MIR_MARGIN) -> LossParts:
    """AVION's MaxMarginRankingLoss over every rank's rows (see module doc); ``logit_scale`` is unused
    (taken for :func:`feature_cache_losses`' signature). Needs at least 2 rows in all."""
    all_video, all_text = gather_with_grad(at_least_fp32(video)), gather_with_grad(at_least_fp32(text))
    sim = _unit(all_text) @ _unit(all_video).T  # (n, n): text i vs video j (AVION's sim_matrix(text, image))
    n = sim.shape[0]
    if n < 2:
        raise ValueError(f"max-margin ranking loss: {n} clip(s) in the batch, it needs negatives (at least 2)")
    positive = sim.diagonal().unsqueeze(1)  # s[i, i], against row i of sim and of sim.T
    off = ~torch.eye(n, dtype=torch.bool, device=sim.device)
    hinge = torch.cat([F.relu(margin - positive + sim)[off], F.relu(margin - positive + sim.T)[off]])
    labels = torch.arange(n, device=sim.device)
    with torch.no_grad():
        clip_acc = 100.0 * (sim.argmax(dim=0) == labels).float().mean()  # video j -> its best text
        t2v_acc = 100.0 * (sim.argmax(dim=1) == labels).float().mean()  # text i -> its best video
    return hinge.mean(), {"clip_acc": clip_acc, "t2v_acc": t2v_acc}


def _unit(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Rows of ``x`` divided by max(their norm, eps) (AVION's ``sim_matrix``)."""
    return x / x.norm(dim=1, keepdim=True).clamp_min(eps)

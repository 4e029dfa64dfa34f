"""The evaluation loop shared by training (periodic validation) and `avion-ds eval`.

``gather_predictions`` is the loop every task's evaluation shares: any callable model (a DeepSpeed engine,
a plain module, or a ZeRO-3 offload inference wrapper) over a (distributed) loader, bad inputs named once,
all ranks' predictions gathered and the sampler's padding removed. ``evaluate_model`` is classification's
use of it (multi-view clips aggregated). It lives below both entry points so neither CLI
module imports the other. ``confusion_images`` draws a classification evaluation's confusion matrices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from avion_ds.data.bad_input import BadInputLog, batch_messages
from avion_ds.distributed.run_log import progress
from avion_ds.tasks.common.classification_metrics import compute_metrics
from avion_ds.tasks.common.pictures import confusion_image
from avion_ds.tasks.common.predictions import PredictionStore, aggregate_outputs, failed_in_batch, gather_failed

if TYPE_CHECKING:
    from avion_ds.tasks.base import EvalContext


def augmented_batch(batch: dict[str, Any], augment: Callable, device: torch.device) -> tuple[torch.Tensor, Any]:
    """A loader batch on ``device`` through the evaluation augmentation: (float frames, targets)."""
    frames = batch["frames"].to(device, non_blocking=True)
    labels = batch["label"]
    labels = {k: v.to(device) for k, v in labels.items()} if isinstance(labels, dict) else labels.to(device)
    return augment(frames, labels)


@contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode for the block, its training mode restored after (a model without ``eval``,
    e.g. an inference wrapper, is left alone)."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield
    finally:
        if was_training and hasattr(model, "train"):
            model.train()


Forward = Callable[[dict[str, Any], torch.Tensor, Any], tuple[torch.Tensor, Any, Any]]


@torch.no_grad()
def gather_predictions(
    ctx: EvalContext, forward: Forward, label: str = "eval", module: Any = None
) -> tuple[tuple[torch.Tensor, Any, Any], list[dict[str, Any]]]:
    """The loop every evaluation shares: ``forward(batch, x, targets) -> (rows, scores, labels)`` over each
    augmented batch of ``ctx.loader`` with ``module`` (default ``ctx.model``) in eval mode; returns the
    gathered (rows, scores, labels) of all ranks, each row once, and the clips that failed to decode
    (``[{"index", "name", "reason"}]``, excluded from the scores).

    Bad samples a deferring dataset reports are named once (``ctx.bad_log``); a fatal one
    (``data.on_error: raise``) raises the same DataError on every rank after the loop.
    """
    store = PredictionStore()
    failed: dict[int, str] = {}
    bad, fatal = [], []
    with eval_mode(ctx.model if module is None else module):
        for batch in progress(ctx.loader, label):
            b, f = batch_messages(batch)
            bad += b
            fatal += f
            x, targets = augmented_batch(batch, ctx.augment, ctx.device)
            store.add(*forward(batch, x, targets))
            failed.update(failed_in_batch(batch))
    (ctx.bad_log or BadInputLog(lambda msg: print(msg, flush=True))).exchange(bad, fatal)
    return store.gather(), gather_failed(failed, ctx.loader.dataset)


def evaluate_model(ctx: EvalContext) -> tuple[dict[str, float], tuple, list[dict[str, Any]]]:
    """Classification metrics over ``ctx.loader`` (all ranks), the gathered (index, probabilities, labels)
    and the clips that failed to decode (:func:`gather_predictions`)."""

    def forward(batch: dict[str, Any], x: torch.Tensor, targets: Any) -> tuple[torch.Tensor, Any, Any]:
        scores = aggregate_outputs(ctx.model(x.to(ctx.dtype)), ctx.views)  # probabilities (metrics.SCORES)
        return batch["index"], scores, targets

    (index, scores, labels), failed = gather_predictions(ctx, forward)
    return compute_metrics(scores, labels), (index, scores, labels), failed


def confusion_images(per_sample: list[dict[str, Any]] | None, classes: int | dict[str, int]) -> dict[str, np.ndarray]:
    """``{"eval/confusion_<head>": picture}`` (one head: ``eval/confusion``) from an evaluation's per-sample
    rows (:func:`~avion_ds.tasks.common.predictions.per_sample_records`); empty without rows."""
    if not per_sample:
        return {}
    heads = classes if isinstance(classes, dict) else {"": classes}
    out = {}
    for head, n in heads.items():
        key = f"{head}_" if head else ""
        labels = np.array([r[f"{key}label"] for r in per_sample])
        preds = np.array([r[f"{key}pred"] for r in per_sample])
        out[f"eval/confusion_{head}" if head else "eval/confusion"] = confusion_image(labels, preds, int(n))
    return out

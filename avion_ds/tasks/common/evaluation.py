"""The evaluation loop shared by training (periodic validation) and `avion-ds eval`.

``evaluate_model`` runs any callable model (a DeepSpeed engine, a plain module, or a ZeRO-3 offload
inference wrapper) over a (distributed) loader, aggregates multi-view clips, gathers all ranks'
predictions and removes the sampler's padding. It lives below both entry points so neither CLI
module imports the other. ``confusion_images`` draws a classification evaluation's confusion matrices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from avion_ds.data.bad_input import BadInputLog, batch_messages
from avion_ds.distributed.run_log import progress
from avion_ds.tasks.common.classification_metrics import compute_metrics
from avion_ds.tasks.common.pictures import confusion_image
from avion_ds.tasks.common.predictions import PredictionStore, aggregate_outputs, failed_in_batch, gather_failed


def augmented_batch(batch: dict[str, Any], augment: Callable, device: torch.device) -> tuple[torch.Tensor, Any]:
    """A loader batch on ``device`` through the evaluation augmentation: (float frames, targets)."""
    frames = batch["frames"].to(device, non_blocking=True)
    labels = batch["label"]
    labels = {k: v.to(device) for k, v in labels.items()} if isinstance(labels, dict) else labels.to(device)
    return augment(frames, labels)


@torch.no_grad()
def evaluate_model(
    model: Callable[[torch.Tensor], Any],
    loader: Any,
    augment: Callable,
    views: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    bad_log: BadInputLog | None = None,
) -> tuple[dict[str, float], tuple, list[dict[str, Any]]]:
    """Metrics over ``loader`` (all ranks), the gathered (index, probabilities, labels), and the
    clips that failed to decode (``[{"index", "name", "reason"}]``, excluded from the metrics).

    Bad samples a deferring dataset reports are named once (``bad_log``); a fatal one
    (``data.on_error: raise``) raises the same DataError on every rank after the loop.
    """
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    store = PredictionStore()
    failed: dict[int, str] = {}
    bad_log = bad_log or BadInputLog(lambda msg: print(msg, flush=True))
    bad, fatal = [], []
    for batch in progress(loader, "eval"):
        b, f = batch_messages(batch)
        bad += b
        fatal += f
        x, targets = augmented_batch(batch, augment, device)
        out = model(x.to(dtype))
        scores = aggregate_outputs(out, views)  # probabilities for any view count (metrics.SCORES)
        store.add(batch["index"], scores, targets)
        failed.update(failed_in_batch(batch))
    if was_training and hasattr(model, "train"):
        model.train()
    bad_log.exchange(bad, fatal)
    index, scores, labels = store.gather()
    return compute_metrics(scores, labels), (index, scores, labels), gather_failed(failed, loader.dataset)


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

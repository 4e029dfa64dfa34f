"""Video-text retrieval evaluation of a dual encoder: EPIC-100 MIR (AVION's ``validate_mir``) or, on a
set without relevancy files, the contrastive accuracies over the whole set.

Every row's clip and narration are embedded (one view), gathered from all ranks and ordered by CSV
row with the DistributedSampler's padding dropped, so 1 and N ranks see the same matrix. MIR: the
similarity ``(V T^T + 1) / 2`` is computed in float32 from float32 unit embeddings (bf16 ones would
leave ~128 distinct similarity levels and many false ties), its columns are the rows the sentence file
lists, in its order, and the six numbers come from :func:`avion_ds.tasks.common.retrieval_metrics.mir_metrics` (through
``mir_metrics_matched``). Rows whose clip could not be decoded are named and left out with their columns
(the report says how many); a video or sentence that then has no exact match is no query of its
direction but stays a candidate of the other (named in one line and in the report).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from avion_ds.distributed import dist
from avion_ds.tasks.base import EvalContext, EvalOutcome
from avion_ds.tasks.common.evaluation import gather_predictions
from avion_ds.tasks.common.retrieval_metrics import mir_metrics_matched

MIR_PROTOCOL = (
    "EPIC-100 MIR zero-shot (AVION validate_mir): similarity (V T^T + 1) / 2 in float32, rows in CSV order, "
    "columns = the sentence file's rows; mAP and nDCG both directions (JPoSE)"
)


def embed_rows(ctx: EvalContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    """(rows, video embeddings, text embeddings, failed clips) of every rank, ordered by row, each once."""

    def forward(batch: dict[str, Any], x: torch.Tensor, targets: Any) -> tuple[torch.Tensor, Any, Any]:
        out = ctx.model(x.to(ctx.dtype), targets["tokens"])
        rows = targets["row"] if "row" in targets else batch["index"]
        return rows, out.video.float(), out.text.float()

    (rows, video, text), failed = gather_predictions(ctx, forward)
    return rows, video, text, failed


def contrastive_accuracies(video: torch.Tensor, text: torch.Tensor) -> dict[str, float]:
    """Top-1 video->text / text->video (percent) with the whole set as one batch."""
    if video.shape[0] == 0:
        return {"clip_acc": 0.0, "t2v_acc": 0.0}
    sim = video.float() @ text.float().T
    labels = torch.arange(sim.shape[0])
    return {
        "clip_acc": 100.0 * float((sim.argmax(dim=1) == labels).float().mean()),
        "t2v_acc": 100.0 * float((sim.argmax(dim=0) == labels).float().mean()),
    }


def mir_from_embeddings(
    rows: torch.Tensor,
    video: torch.Tensor,
    text: torch.Tensor,
    columns: np.ndarray,
    relevancy: np.ndarray,
    names: tuple[list[str], list[str]] = ([], []),
) -> tuple[dict[str, float], dict[str, Any]]:
    """MIR metrics of the embedded ``rows`` against the (rows x columns) ``relevancy``; ``columns[j]`` is
    the row whose narration is sentence j. Rows absent from ``rows`` drop out with their columns; a
    remaining video or sentence left without an exact match is no query of its direction
    (:func:`~avion_ds.tasks.common.retrieval_metrics.mir_metrics_matched`), named in the report by ``names`` (row ids,
    sentence ids)."""
    n_rows, n_cols = relevancy.shape
    position = {int(r): i for i, r in enumerate(rows.tolist())}
    keep_rows = np.array([r for r in range(n_rows) if r in position], dtype=np.int64)
    keep_cols = np.array([j for j, r in enumerate(columns.tolist()) if int(r) in position], dtype=np.int64)
    v = video[[position[int(r)] for r in keep_rows]].float()
    t = text[[position[int(columns[j])] for j in keep_cols]].float()
    similarity = ((v @ t.T + 1.0) / 2.0).numpy()  # float32, as AVION's numpy matmul of float32 embeddings
    rel = relevancy[np.ix_(keep_rows, keep_cols)]
    metrics, left = mir_metrics_matched(similarity, rel)
    row_names, col_names = names
    report = {
        **text_to_video_hits(similarity, rel),
        "protocol": MIR_PROTOCOL,
        "rows": int(len(keep_rows)),
        "rows_total": int(n_rows),
        "columns": int(len(keep_cols)),
        "columns_total": int(n_cols),
        "vis_queries": int(len(keep_rows) - len(left["rows"])),
        "txt_queries": int(len(keep_cols) - len(left["columns"])),
        "no_match_videos": [_name(row_names, int(keep_rows[i])) for i in left["rows"]],
        "no_match_sentences": [_name(col_names, int(keep_cols[j])) for j in left["columns"]],
    }
    return metrics, report


def _name(names: list[str], i: int) -> str:
    return names[i] if i < len(names) else str(i)


def no_match_line(report: dict[str, Any], show: int = 5) -> str | None:
    """One line naming the videos / sentences that were no MIR query (None when there are none)."""
    parts = []
    for key, what in (("no_match_videos", "video(s)"), ("no_match_sentences", "sentence(s)")):
        names = report.get(key) or []
        if names:
            more = f", ... (+{len(names) - show})" if len(names) > show else ""
            parts.append(f"{len(names)} {what} ({', '.join(names[:show])}{more})")
    if not parts:
        return None
    return (
        f"MIR: {' and '.join(parts)} kept no exact match once the clips that failed or were dropped left out "
        "their rows and columns: not scored as queries, still ranked as candidates"
    )


def text_to_video_hits(similarity: np.ndarray, relevancy: np.ndarray) -> dict[str, float]:
    """Text -> video R-precision on exact matches: for each sentence, the share of its R best clips that
    have relevancy 1 to it (the same narration: verb and noun), R = the number of such clips; next to
    chance, the mean share of clips with relevancy 1 to a sentence (what a random ranking gets)."""
    exact = relevancy == 1
    if similarity.size == 0:
        return {"t2v_rprecision": 0.0, "t2v_rprecision_chance": 0.0}
    order = np.argsort(-similarity, axis=0, kind="stable")  # clips by similarity, per sentence
    hits = []
    for j in range(similarity.shape[1]):
        r = int(exact[:, j].sum())
        hits.append(float(exact[order[:r, j], j].mean()) if r else 0.0)
    return {
        "t2v_rprecision": 100.0 * float(np.mean(hits)),
        "t2v_rprecision_chance": 100.0 * float(exact.mean(axis=0).mean()),
    }


def dataset_rows_report(dataset: Any) -> dict[str, Any]:
    """Rows the dataset dropped before evaluation (absent videos, quarantined files)."""
    missing = list(getattr(dataset, "missing", []))
    quarantined = list(getattr(dataset, "quarantined", []))
    return {
        "num_missing": len(missing),
        "num_quarantined": len(quarantined),
        "missing": missing,
        "quarantined": quarantined,
    }


def evaluate_retrieval(ctx: EvalContext) -> EvalOutcome:
    """MIR metrics when the dataset carries relevancy targets (``mir_targets``), else accuracies."""
    rows, video, text, failed = embed_rows(ctx)
    targets = getattr(ctx.loader.dataset, "mir_targets", None)
    if targets is None:
        metrics = contrastive_accuracies(video, text)
        report: dict[str, Any] = {"protocol": "contrastive top-1 over the whole set", "rows": int(rows.numel())}
    else:
        names = (targets.row_ids, targets.sentence_ids)
        metrics, report = mir_from_embeddings(rows, video, text, np.asarray(targets.columns), targets.relevancy, names)
        line = no_match_line(report)
        if line and dist.is_main():
            (ctx.bad_log.emit if ctx.bad_log is not None else print)(line)
    report.update(dataset_rows_report(ctx.loader.dataset))
    return EvalOutcome(metrics, report, failed, num_samples=int(rows.numel()))

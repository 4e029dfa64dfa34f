"""EPIC-Kitchens-100 multi-instance retrieval metrics (JPoSE's evaluation, as AVION runs it): mAP and
nDCG both ways over a (videos x sentences) similarity against the relevancy matrix (numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _mir_checked(similarity: Any, relevancy: Any) -> tuple[Any, Any]:
    """Both matrices as 2-D numpy arrays of one shape, every row AND column with a relevancy of exactly
    1 (the reference divides by the count of those: a row or column without one would be a NaN)."""
    sim, rel = np.asarray(similarity), np.asarray(relevancy)  # their own dtypes: the reference computes in them
    if sim.ndim != 2 or sim.shape != rel.shape:
        raise ValueError(f"mir_metrics: similarity {sim.shape} and relevancy {rel.shape} must be 2-D and of one shape")
    for axis, what in ((1, "row (video)"), (0, "column (sentence)")):
        empty = np.flatnonzero(~(rel == 1).any(axis=axis))
        if empty.size:
            raise ValueError(
                f"mir_metrics: relevancy {what} {int(empty[0])} has no entry equal to 1 "
                f"({empty.size} such); mAP is undefined for it"
            )
    return sim, rel


def _mean_average_precision(sim: Any, rel: Any) -> float:
    """Rows are queries. Ranked by ``(-sim).argsort()`` (numpy's default sort, as the reference, so ties
    fall the same way); precision at a hit is the summed relevancy so far over the rank; hits are
    relevancy == 1."""
    order = (-sim).argsort()
    ranked = np.take_along_axis(rel, order, axis=1)
    hits = ranked == 1
    found = np.where(hits, np.cumsum(ranked, axis=1), 0.0)
    precision = found / (np.arange(ranked.shape[1]) + 1)
    return float(np.mean(precision.sum(axis=1) / hits.sum(axis=1)))


def _dcg(sim: Any, rel: Any, k_mask: Any) -> Any:
    order = np.argsort(sim)[:, ::-1]  # the reference's ranking for nDCG (descending, ties reversed)
    gains = np.take_along_axis(rel, order, axis=1) * k_mask
    return np.sum(gains / np.log2(np.arange(sim.shape[1]) + 2), axis=1)


def _normalised_dcg(sim: Any, rel: Any) -> float:
    """nDCG over the first k ranks, k = the row's nonzero relevancies; ideal = ranking by relevancy itself."""
    k_mask = (np.sort(rel)[:, ::-1] > 0).astype(int)
    return float(np.mean(_dcg(sim, rel, k_mask) / _dcg(rel, rel, k_mask)))


def mir_metrics(similarity: Any, relevancy: Any) -> dict[str, float]:
    """EPIC-Kitchens-100 MIR metrics of a (videos x sentences) ``similarity`` against ``relevancy``:
    ``vis_*`` rank sentences per video, ``txt_*`` videos per sentence, ``avg_*`` their mean; numbers equal
    to JPoSE's / AVION's evaluation code on any input, ties included. ValueError (one line) when a row or
    column has no relevancy of exactly 1."""
    sim, rel = _mir_checked(similarity, relevancy)
    return _six(
        (_mean_average_precision(sim, rel), _normalised_dcg(sim, rel)),
        (_mean_average_precision(sim.T, rel.T), _normalised_dcg(sim.T, rel.T)),
    )


def _six(vis: tuple[float, float], txt: tuple[float, float]) -> dict[str, float]:
    """The six MIR numbers from each direction's (mAP, nDCG)."""
    return {
        "vis_map": vis[0],
        "txt_map": txt[0],
        "avg_map": (vis[0] + txt[0]) / 2,
        "vis_ndcg": vis[1],
        "txt_ndcg": txt[1],
        "avg_ndcg": (vis[1] + txt[1]) / 2,
    }


def mir_metrics_matched(similarity: Any, relevancy: Any) -> tuple[dict[str, float], dict[str, list[int]]]:
    """:func:`mir_metrics` of what can be scored after rows or columns were left out (a clip that failed
    to decode drops its row and its narration's column): a row (video) with no relevancy of exactly 1 is
    no ``vis_*`` query but stays a candidate that the ``txt_*`` queries rank, and a column (sentence)
    likewise; a direction with no query scores 0. Returns the metrics and the left-out queries
    (``{"rows": [...], "columns": [...]}``, indices). Equal to :func:`mir_metrics` when every row and
    column has an exact 1."""
    sim, rel = np.asarray(similarity), np.asarray(relevancy)
    if sim.ndim != 2 or sim.shape != rel.shape:
        raise ValueError(f"mir_metrics: similarity {sim.shape} and relevancy {rel.shape} must be 2-D and of one shape")
    exact = rel == 1
    rows, cols = np.flatnonzero(exact.any(axis=1)), np.flatnonzero(exact.any(axis=0))

    def direction(s: Any, r: Any) -> tuple[float, float]:
        if s.shape[0] == 0:
            return 0.0, 0.0
        return _mean_average_precision(s, r), _normalised_dcg(s, r)

    metrics = _six(direction(sim[rows], rel[rows]), direction(sim.T[cols], rel.T[cols]))
    left = {
        "rows": np.flatnonzero(~exact.any(axis=1)).tolist(),
        "columns": np.flatnonzero(~exact.any(axis=0)).tolist(),
    }
    return metrics, left

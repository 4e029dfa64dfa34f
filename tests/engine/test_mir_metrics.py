"""EPIC-Kitchens-100 MIR metrics equal the reference evaluation (JPoSE, as AVION ships it), ties included.

The oracle below is AVION's ``avion/utils/evaluation_ek100mir.py`` (MIT licence; itself from JPoSE's
``NDCG.py`` / ``mAP.py``), copied unchanged apart from comments and formatting.
"""

from __future__ import annotations

import numpy as np
import pytest

from avion_ds.tasks.common.retrieval_metrics import mir_metrics


# ---- the reference (AVION, MIT) ---------------------------------------------------------------------
def calculate_DCG(similarity_matrix, relevancy_matrix, k_counts):
    x_sz, y_sz = similarity_matrix.shape
    ranks = np.argsort(similarity_matrix)[:, ::-1]
    logs = np.log2(np.arange(y_sz) + 2)
    divisors = np.repeat(np.expand_dims(logs, axis=0), x_sz, axis=0)
    columns = np.repeat(np.expand_dims(np.arange(x_sz), axis=1), y_sz, axis=1)
    numerators = relevancy_matrix[columns, ranks] * k_counts
    return np.sum(numerators / divisors, axis=1)


def calculate_k_counts(relevancy_matrix):
    return (np.sort(relevancy_matrix)[:, ::-1] > 0).astype(int)


def calculate_IDCG(relevancy_matrix, k_counts):
    return calculate_DCG(relevancy_matrix, relevancy_matrix, k_counts)


def calculate_nDCG(similarity_matrix, relevancy_matrix, k_counts=None, IDCG=None, reduction="mean"):
    if k_counts is None:
        k_counts = calculate_k_counts(relevancy_matrix)
    DCG = calculate_DCG(similarity_matrix, relevancy_matrix, k_counts)
    if IDCG is None:
        IDCG = calculate_IDCG(relevancy_matrix, k_counts)
    if reduction == "mean":
        return np.mean(DCG / IDCG)
    return DCG / IDCG


def calculate_mAP(sim_mat, relevancy_matrix):
    ranked_order = (-sim_mat).argsort()
    ranked_rel_mat = relevancy_matrix[np.arange(relevancy_matrix.shape[0])[:, None], ranked_order]
    cumulative_rel_mat = np.cumsum(ranked_rel_mat, axis=1)
    cumulative_rel_mat[ranked_rel_mat != 1] = 0
    divisor = np.arange(ranked_rel_mat.shape[1]) + 1
    number_rel_docs = np.sum(ranked_rel_mat == 1, axis=1)
    avg_precision = np.sum(cumulative_rel_mat / divisor, axis=1) / number_rel_docs
    return np.mean(avg_precision)


def get_mAP(similarity_matrix, rel_matrix):
    vis_map = calculate_mAP(similarity_matrix, rel_matrix)
    txt_map = calculate_mAP(similarity_matrix.T, rel_matrix.T)
    return vis_map, txt_map, (vis_map + txt_map) / 2


def get_nDCG(similarity_matrix, rel_matrix):
    vis_k_counts = calculate_k_counts(rel_matrix)
    txt_k_counts = calculate_k_counts(rel_matrix.T)
    vis_IDCG = calculate_IDCG(rel_matrix, vis_k_counts)
    txt_IDCG = calculate_IDCG(rel_matrix.T, txt_k_counts)
    vis_nDCG = calculate_nDCG(similarity_matrix, rel_matrix, k_counts=vis_k_counts, IDCG=vis_IDCG)
    txt_nDCG = calculate_nDCG(similarity_matrix.T, rel_matrix.T, k_counts=txt_k_counts, IDCG=txt_IDCG)
    return vis_nDCG, txt_nDCG, (vis_nDCG + txt_nDCG) / 2


# ---- the tests ----------------------------------------------------------------------------------------
def _reference(sim: np.ndarray, rel: np.ndarray) -> dict[str, float]:
    vis_map, txt_map, avg_map = get_mAP(sim, rel.copy())
    vis_ndcg, txt_ndcg, avg_ndcg = get_nDCG(sim, rel.copy())
    return {
        "vis_map": vis_map,
        "txt_map": txt_map,
        "avg_map": avg_map,
        "vis_ndcg": vis_ndcg,
        "txt_ndcg": txt_ndcg,
        "avg_ndcg": avg_ndcg,
    }


def _relevancy(rng: np.random.Generator, n: int, m: int, dtype: type) -> np.ndarray:
    """EPIC-style graded relevancy (0, 1/3, 1/2, 2/3, 1) with at least one exact 1 per row and column."""
    rel = rng.choice(np.array([0.0, 1 / 3, 0.5, 2 / 3, 1.0]), size=(n, m), p=[0.6, 0.1, 0.1, 0.1, 0.1])
    rel[np.arange(n), rng.integers(0, m, n)] = 1.0
    rel[rng.integers(0, n, m), np.arange(m)] = 1.0
    return rel.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("levels", [4, 16, 0])  # few similarity levels: many ties; 0: continuous
@pytest.mark.parametrize("shape", [(20, 30), (37, 23), (64, 64)])
def test_equals_the_reference_with_ties(shape: tuple[int, int], levels: int, dtype: type) -> None:
    rng = np.random.default_rng(shape[0] * 100 + levels)
    sim = rng.random(shape)
    if levels:
        sim = np.floor(sim * levels) / levels  # (V T^T + 1) / 2 of low-precision embeddings ties a lot
    sim, rel = sim.astype(dtype), _relevancy(rng, *shape, dtype)
    ours, ref = mir_metrics(sim, rel), _reference(sim, rel)
    assert set(ours) == {"vis_map", "txt_map", "avg_map", "vis_ndcg", "txt_ndcg", "avg_ndcg"}
    for key, value in ref.items():
        assert ours[key] == float(value), (key, ours[key], value)  # exactly: same ranking, same arithmetic
        assert isinstance(ours[key], float)


def test_hand_computed_small_case() -> None:
    # 2 videos x 3 sentences. Video 0 ranks sentences (2, 0, 1); relevant (== 1): sentence 0 -> AP = (1/2) / 1.
    # Video 1 ranks (1, 2, 0); relevancy (0, 1, 0.5) -> hit at rank 1: AP = 1.
    sim = np.array([[0.5, 0.1, 0.9], [0.2, 0.8, 0.4]])
    rel = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.5]])
    with pytest.raises(ValueError, match=r"column \(sentence\) 2 has no entry equal to 1"):
        mir_metrics(sim, rel)
    rel[0, 2] = 1.0  # now sentence 2 is an exact match for video 0 as well
    out = mir_metrics(sim, rel)
    # video 0: ranks (2, 0, 1), relevancies (1, 1, 0): AP = (1/1 + 2/2) / 2 = 1; video 1: AP = 1
    assert out["vis_map"] == 1.0
    # sentence 0: videos ranked (0, 1), rel (1, 0): AP 1; sentence 1: (1, 0) rel (1, 0): 1;
    # sentence 2: (0, 1) rel (1, 0.5): AP = 1/1 / 1 = 1
    assert out["txt_map"] == 1.0 and out["avg_map"] == 1.0
    # nDCG of video 1: k = 2 (two nonzero), ranking (1, 2): gains 1/log2(2) + 0.5/log2(3) = ideal -> 1
    assert out["vis_ndcg"] == pytest.approx(1.0) and out["avg_ndcg"] == pytest.approx(1.0)
    worse = mir_metrics(np.array([[0.9, 0.5, 0.1], [0.8, 0.2, 0.4]]), rel)
    assert worse["vis_map"] < 1.0 and worse == _reference(np.array([[0.9, 0.5, 0.1], [0.8, 0.2, 0.4]]), rel)


def test_bad_shapes_and_rows_without_a_match_are_refused() -> None:
    with pytest.raises(ValueError, match="must be 2-D and of one shape"):
        mir_metrics(np.zeros((2, 3)), np.zeros((3, 2)))
    rel = np.eye(3)
    rel[1, 1] = 0.5
    with pytest.raises(ValueError, match=r"row \(video\) 1 has no entry equal to 1"):
        mir_metrics(np.random.default_rng(0).random((3, 3)), rel)

"""One clip that fails to decode never kills an MIR evaluation: its row and its narration's column are left
out, a video or sentence then without an exact match is no query of its direction but stays a candidate of
the other (the reference formulas over what remains), and the left-out ones are named. A relevancy matrix
with NaN, infinite or negative values, or an evaluation row / column without an exact 1, and an
evaluation row with stop < start, are refused when the dataset is built (start-up, one line)."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from avion_ds.data.bad_input import BadInputLog
from avion_ds.data.datasets.epic_mir import MirTargets, load_mir_targets
from avion_ds.tasks.base import EvalContext
from avion_ds.tasks.common.retrieval_eval import evaluate_retrieval
from avion_ds.tasks.common.retrieval_metrics import mir_metrics, mir_metrics_matched
from tests.engine.test_mir_metrics import calculate_mAP, calculate_nDCG

# rows 2 and 3 narrate "open tap": the sentence's text is row 2's (first occurrence, AVION's indexing),
# so when row 2's clip fails, row 3 keeps no exact match
RELEVANCY = np.array([[1.0, 0.2, 0.0], [0.1, 1.0, 0.3], [0.0, 0.3, 1.0], [0.0, 0.5, 1.0]])
COLUMNS = np.array([0, 1, 2])
ROW_IDS = ["P01_01_0", "P01_01_1", "P01_01_2", "P01_01_3"]
SENTENCE_IDS = ["P01_01_0", "P01_01_1", "P01_01_2"]


def _reference(sim: np.ndarray, rel: np.ndarray) -> dict[str, float]:
    """JPoSE / AVION's formulas, each direction over its queries with an exact match (all candidates)."""
    rows, cols = (rel == 1).any(axis=1), (rel == 1).any(axis=0)
    vis_map, txt_map = calculate_mAP(sim[rows], rel[rows]), calculate_mAP(sim.T[cols], rel.T[cols])
    vis_ndcg, txt_ndcg = calculate_nDCG(sim[rows], rel[rows]), calculate_nDCG(sim.T[cols], rel.T[cols])
    return {"vis_map": vis_map, "txt_map": txt_map, "vis_ndcg": vis_ndcg, "txt_ndcg": txt_ndcg}


def test_matched_metrics_equal_mir_metrics_when_every_query_has_a_match() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        sim = rng.integers(0, 4, (7, 5)).astype(np.float32)  # many ties
        rel = rng.choice([0.0, 0.25, 0.5], (7, 5))
        rel[np.arange(7), rng.integers(0, 5, 7)] = 1.0
        rel[rng.integers(0, 7, 5), np.arange(5)] = 1.0
        got, left = mir_metrics_matched(sim, rel)
        assert got == mir_metrics(sim, rel) and left == {"rows": [], "columns": []}


def test_matched_metrics_follow_the_reference_over_what_remains() -> None:
    rng = np.random.default_rng(1)
    sim = rng.random((6, 4)).astype(np.float32)
    rel = rng.choice([0.0, 0.3, 0.6], (6, 4))
    rel[[0, 1, 3], [0, 1, 2]] = 1.0  # rows 2, 4, 5 and column 3 have no exact match
    got, left = mir_metrics_matched(sim, rel)
    assert left == {"rows": [2, 4, 5], "columns": [3]}
    for key, value in _reference(sim, rel).items():
        assert got[key] == pytest.approx(value, rel=0, abs=1e-12), key
    assert got["avg_map"] == pytest.approx((got["vis_map"] + got["txt_map"]) / 2)
    with pytest.raises(ValueError, match="no entry equal to 1"):
        mir_metrics(sim, rel)  # the strict metric still refuses: the evaluation chooses what to score
    empty, left = mir_metrics_matched(sim[:, 3:], rel[:, 3:])
    assert empty["vis_map"] == empty["txt_map"] == 0.0 and left["columns"] == [0]


class _Loader:
    """Batches as the MIR dataset's loader yields them; the clip of row 2 failed and row 1 stands in."""

    def __init__(self, dataset: object, failed_row: int) -> None:
        self.dataset = dataset
        self.batches = []
        for asked in ([0, 1], [2, 3]):
            part = [r if r != failed_row else 1 for r in asked]  # the failed clip's stand-in
            frames = torch.zeros(len(part), 2, 4, 4, 3, dtype=torch.uint8)
            frames[:, 0, 0, 0, 0] = torch.tensor(part, dtype=torch.uint8)
            tokens = torch.zeros(len(part), 77, dtype=torch.long)
            tokens[:, 0] = torch.tensor(part)
            failed = torch.tensor([r if r == failed_row else -1 for r in asked])
            self.batches.append(
                {
                    "frames": frames,
                    "label": {"tokens": tokens, "row": torch.tensor(part), "relevancy": torch.ones(len(part))},
                    "index": torch.tensor(part),
                    "failed_index": failed,
                    "failed_reason": ["bad chunk"] * len(part),
                }
            )

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def test_a_failed_clip_leaves_an_evaluation_of_what_remains() -> None:
    torch.manual_seed(0)
    video = torch.nn.functional.normalize(torch.randn(4, 8), dim=1)
    text = torch.nn.functional.normalize(torch.randn(4, 8), dim=1)

    def model(x: torch.Tensor, tokens: torch.Tensor) -> SimpleNamespace:
        rows = x[:, 0, 0, 0, 0].long()
        return SimpleNamespace(video=video[rows], text=text[tokens[:, 0]])

    targets = MirTargets(COLUMNS, RELEVANCY, SENTENCE_IDS, ["cut onion", "rinse cup", "open tap"], ROW_IDS)
    dataset = SimpleNamespace(mir_targets=targets, row_name=lambda i: ROW_IDS[i], missing=[], quarantined=[])
    lines: list[str] = []
    loader = _Loader(dataset, failed_row=2)
    augment = lambda f, lab: (f.float(), lab)
    out = evaluate_retrieval(
        EvalContext(model, loader, augment, torch.device("cpu"), None, bad_log=BadInputLog(lines.append))
    )
    assert [f["name"] for f in out.failed] == ["P01_01_2"]
    assert out.report["rows"] == 3 and out.report["columns"] == 2
    assert out.report["vis_queries"] == 2 and out.report["txt_queries"] == 2
    assert out.report["no_match_videos"] == ["P01_01_3"] and out.report["no_match_sentences"] == []
    assert len(lines) == 1 and "1 video(s) (P01_01_3)" in lines[0] and "not scored as queries" in lines[0]
    keep_rows, keep_cols = [0, 1, 3], [0, 1]
    sim = ((video[keep_rows] @ text[COLUMNS[keep_cols]].T + 1) / 2).numpy()
    want = _reference(sim, RELEVANCY[np.ix_(keep_rows, keep_cols)])
    for key, value in want.items():
        assert out.metrics[key] == pytest.approx(value, rel=0, abs=1e-12), key


# ---------------------------------------------------------------------------------------------
# start-up checks
# ---------------------------------------------------------------------------------------------
def _files(tmp_path: Path, rel: np.ndarray) -> tuple[Path, Path, Path]:
    csv_path = tmp_path / "test.csv"
    csv_path.write_text(
        "narration_id,video_id,start_timestamp,stop_timestamp,narration\n"
        + "".join(f"{rid},P01_01,00:00:01.00,00:00:02.00,x\n" for rid in ROW_IDS)
    )
    sentences = tmp_path / "sentences.csv"
    sentences.write_text("narration_id,narration\n" + "".join(f"{s},x\n" for s in SENTENCE_IDS))
    pkl = tmp_path / "relevancy.pkl"
    pkl.write_bytes(pickle.dumps(rel))
    return csv_path, sentences, pkl


def _edit(row: int, col: int, value: float) -> np.ndarray:
    rel = RELEVANCY.copy()
    rel[row, col] = value
    return rel


@pytest.mark.parametrize(
    ("rel", "evaluation", "message"),
    [
        (_edit(1, 2, np.nan), False, r"1 NaN or infinite relevancy value\(s\), first at row 1, sentence 2"),
        (_edit(0, 1, np.inf), True, r"1 NaN or infinite relevancy value\(s\), first at row 0, sentence 1 \(inf\)"),
        (_edit(3, 0, -0.5), False, r"1 negative relevancy value\(s\), first at row 3, sentence 0"),
        (_edit(0, 0, 0.99), True, r"relevancy row \(video\) 0 has no entry equal to 1"),
        (
            np.array([[1.0, 0.2, 0.0], [0.1, 1.0, 0.3], [0.0, 1.0, 0.9], [1.0, 0.5, 0.9]]),
            True,
            r"relevancy column \(sentence\) 2 has no entry equal to 1",
        ),
    ],
    ids=["nan", "inf", "negative", "row-without-1", "column-without-1"],
)
def test_bad_relevancy_is_refused_when_loaded(rel: np.ndarray, evaluation: bool, message: str, tmp_path: Path) -> None:
    csv_path, sentences, pkl = _files(tmp_path, rel)
    with pytest.raises(ValueError, match=rf"^{pkl}: {message}") as info:
        load_mir_targets(csv_path, sentences, pkl, evaluation=evaluation)
    assert "\n" not in str(info.value)


def test_training_relevancy_may_lack_exact_matches(tmp_path: Path) -> None:
    csv_path, sentences, pkl = _files(tmp_path, _edit(0, 0, 0.99))
    assert load_mir_targets(csv_path, sentences, pkl).relevancy[0, 0] == 0.99  # captions drawn by value


def test_evaluation_dataset_refuses_bad_relevancy_and_backwards_rows_at_start_up(tmp_path: Path) -> None:
    """Through the recipe path that training and `avion-ds eval` take (``run_setup.build_split``: one
    ConfigError line, before any process group)."""
    from avion_ds.config import ConfigError
    from avion_ds.engine.run_setup import build_split
    from avion_ds.tasks import load_recipe, task_of

    root = tmp_path / "chunks"
    root.mkdir()
    (root / "manifest.jsonl").write_text(  # the checks never open a video
        '{"video_id": "P01_01", "path": "P01_01/0.mp4", "start_frame": 0, "frames": 300, "fps": 30, '
        '"width": 64, "height": 48, "job": 1}\n'
    )
    csv_path, sentences, pkl = _files(tmp_path, _edit(2, 1, np.nan))
    recipe = load_recipe(
        None,
        [
            "task=contrastive",
            "model.name=clip_vit_test_tiny",
            "data.dataset=epic_mir",
            f"data.root={root}",
            f"data.val_csv={csv_path}",
            f"epic_mir.val_sentences={sentences}",
            f"epic_mir.val_relevancy={pkl}",
        ],
    )
    with pytest.raises(ConfigError, match=rf"{pkl}: 1 NaN or infinite relevancy"):
        build_split(recipe, task_of(recipe), "val", views=True)
    pkl.write_bytes(pickle.dumps(RELEVANCY))
    lines = csv_path.read_text().splitlines()
    lines[3] = "P01_01_2,P01_01,00:00:05.00,00:00:02.00,x"
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"{csv_path}:4 \(P01_01_2\): stop_timestamp 00:00:02.00 is before") as info:
        build_split(recipe, task_of(recipe), "val", views=True)
    assert "\n" not in str(info.value)

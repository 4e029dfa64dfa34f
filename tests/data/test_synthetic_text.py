"""Synthetic narrations: Ego4D-style pairs for the train segments, EPIC-100 MIR files for both splits."""

from __future__ import annotations

import ast
import csv
import io
import pickle
from pathlib import Path

import numpy as np
import pytest

from avion_ds.cli import synth as synth_cli
from avion_ds.data.prep import synthetic
from avion_ds.data.sampling import parse_timestamp

# the options docs/data.md gives for a retrieval test: 96 segments of 1 s, half of them val (48 clips);
# 4 verbs x 3 nouns = 12 possible narrations
SMALL = ["--num-videos", "4", "--segments-per-video", "24", "--val-fraction", "0.5", "--segment-seconds", "1"]
SMALL += ["--fps", "8", "--width", "64", "--height", "48"]
MIR = "retrieval_annotations"
# what a restricted unpickler must allow to read the files: builtins, and numpy's array reconstruction
NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed")
        return super().find_class(module, name)


def _load(path: Path):
    plain = pickle.loads(path.read_bytes())
    restricted = _Restricted(io.BytesIO(path.read_bytes())).load()
    assert type(plain) is type(restricted)
    return plain


def _csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth_text") / "s"
    assert synth_cli.main([str(out), *SMALL]) == 0
    return out


def test_files_exist_and_load_with_a_restricted_unpickler(synth) -> None:
    pairs = _load(synth / "ego4d_train.pkl")
    assert isinstance(pairs, list) and all(type(p) is tuple and len(p) == 4 for p in pairs)
    assert all(isinstance(v, str) and type(s) is float and type(e) is float and s < e for v, s, e, _ in pairs)
    for split in ("test", "train"):
        for name in (f"EPIC_100_retrieval_{split}.csv", f"EPIC_100_retrieval_{split}_sentence.csv"):
            assert (synth / MIR / name).is_file()
        rel = _load(synth / MIR / "relevancy" / f"caption_relevancy_EPIC_100_retrieval_{split}.pkl")
        assert isinstance(rel, np.ndarray) and rel.dtype.kind == "f"


def test_ego4d_rows_are_the_train_segments(synth, decode_all) -> None:
    """One pair per train row, inside its segment (1 s segments: [s, s + 1)), its narration a function of
    (verb, noun) naming the noun; the shape at the pair's middle has the noun's colour."""
    train = _csv(synth / "train.csv")
    pairs = _load(synth / "ego4d_train.pkl")
    assert len(pairs) == len(train)
    assert _csv(synth / "ego4d_train.csv") == [
        {"video_uid": v, "start_sec": str(s), "end_sec": str(e), "narration": n} for v, s, e, n in pairs
    ]
    text_of: dict[tuple[int, int], str] = {}
    videos: dict[str, np.ndarray] = {}
    for (vid, start, end, text), r in zip(pairs, train, strict=True):
        seg = int(r["narration_id"].rsplit("_", 1)[1])
        assert vid == r["video_id"] and seg <= start < end <= seg + 1
        assert (start, end) == (parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"]))
        verb, noun = int(r["verb_class"]), int(r["noun_class"])
        assert text.startswith("#C C ") and r["noun"] in text
        assert text_of.setdefault((verb, noun), text) == text
        if vid not in videos:
            videos[vid] = decode_all(synth / "videos" / f"{vid}.mp4").numpy().astype(int)
        frame = videos[vid][int((start + end) / 2 * 8)]
        near = [(np.abs(frame - np.array(c)).max(axis=-1) < 50).sum() for c in synthetic._NOUN_COLOURS[:3]]
        assert int(np.argmax(near)) == noun
    assert len(set(text_of.values())) == len(text_of) >= 8  # distinct (verb, noun) -> distinct narrations


def _jpose(rows: list[dict], sentence_ids: list[str]) -> np.ndarray:
    """JPoSE's EPIC-100 relevancy: 0.5 * IoU of the verb sets + 0.5 * IoU of the noun sets."""
    by_id = {r["narration_id"]: r for r in rows}

    def pos(r):
        return {int(r["verb_class"])}, set(ast.literal_eval(r["all_noun_classes"]))

    out = np.zeros((len(rows), len(sentence_ids)))
    for i, r in enumerate(rows):
        v1, n1 = pos(r)
        for j, sid in enumerate(sentence_ids):
            v2, n2 = pos(by_id[sid])
            out[i, j] = 0.5 * len(v1 & v2) / len(v1 | v2) + 0.5 * len(n1 & n2) / len(n1 | n2)
    return out


@pytest.mark.parametrize("split", ["test", "train"])
def test_mir_files(synth, split) -> None:
    rows = _csv(synth / MIR / f"EPIC_100_retrieval_{split}.csv")
    source = _csv(synth / ("val.csv" if split == "test" else "train.csv"))
    assert list(rows[0]) == [*synthetic.EPIC_COLUMNS, "all_nouns", "all_noun_classes"]
    assert [r["narration_id"] for r in rows] == [r["narration_id"] for r in source]
    for r, s in zip(rows, source, strict=True):
        assert (r["verb_class"], r["noun_class"], r["start_timestamp"]) == (
            s["verb_class"],
            s["noun_class"],
            s["start_timestamp"],
        )
        assert ast.literal_eval(r["all_noun_classes"]) == [int(r["noun_class"])]
        assert ast.literal_eval(r["all_nouns"]) == [r["noun"]]
    with (synth / MIR / f"EPIC_100_retrieval_{split}_sentence.csv").open(newline="") as f:
        sentences = list(csv.reader(f))[1:]
    ids = [s[0] for s in sentences]
    # AVION's reader: the sentence ids index rows of the CSV; column 1 is the narration
    video_ids = [r["narration_id"] for r in rows]
    assert [rows[video_ids.index(i)]["narration"] for i in ids] == [s[1] for s in sentences]
    assert sorted(s[1] for s in sentences) == sorted({r["narration"] for r in rows})  # one per narration
    pairs = {(r["verb_class"], r["noun_class"]) for r in rows}
    assert len({r["narration"] for r in rows}) == len(pairs)  # the narration is a function of (verb, noun)
    rel = _load(synth / MIR / "relevancy" / f"caption_relevancy_EPIC_100_retrieval_{split}.pkl")
    assert rel.shape == (len(rows), len(sentences))
    np.testing.assert_array_equal(rel, _jpose(rows, ids))
    assert (rel == 1).any(axis=1).all() and (rel == 1).any(axis=0).all()
    assert set(np.unique(rel)) <= {0.0, 0.5, 1.0}
    if split == "test":
        assert len(rows) >= 48 and len(sentences) >= 8  # the sizes docs/data.md promises for these options


def test_no_val_rows_no_mir_test_files(tmp_path) -> None:
    info = synthetic.make_synthetic_epic(
        tmp_path / "s", num_videos=1, segments_per_video=2, segment_seconds=0.5, width=32, height=32, val_fraction=0
    )
    assert "mir_test_csv" not in info and not (tmp_path / "s" / MIR / "EPIC_100_retrieval_test.csv").exists()
    assert len(_load(info["ego4d_train_pkl"])) == 2 and info["mir_train_relevancy"].is_file()

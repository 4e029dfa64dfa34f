"""Duplicate narration rows (same video, start, end and text as an earlier row) in Ego4D narration files and
EPIC-100 MIR CSVs are kept (AVION / LaViLa read every row; a MIR row is a relevancy-matrix row) and said in ONE
line at load: how many, and the first with the row it repeats."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from avion_ds.data import build_dataset
from avion_ds.data.datasets import ego4d
from avion_ds.data.datasets.registry import dataset_config
from tests.data.test_ego4d import write_rows

MIR_HEADER = "narration_id,participant_id,video_id,narration_timestamp,start_timestamp,stop_timestamp,narration\n"


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "duplicate" in r.getMessage()]


@pytest.mark.parametrize("suffix", [".pkl", ".csv", ".jsonl"])
def test_ego4d_duplicates_are_kept_and_said_once(tmp_path: Path, suffix: str, caplog: pytest.LogCaptureFixture) -> None:
    rows = [
        ("v0", 1.0, 2.0, "c cuts the onion"),
        ("v0", 1.0, 2.0, "c cuts the onions"),  # same times, other text: not a duplicate
        ("v0", 1.0, 2.0, "c cuts the onion"),  # duplicate of row 1
        ("v1", 1.0, 2.0, "c cuts the onion"),  # other video
        ("v0", 3.0, 4.0, ["c opens", "c opens the tap"]),
        ("v0", 3.0, 4.0, ["c opens", "c opens the tap"]),  # duplicate of row 5
        ("v0", 1.0, 2.0, "c cuts the onion"),  # duplicate of row 1 again
    ]
    path = write_rows(tmp_path / f"narr{suffix}", rows)
    ego4d._read_cached.cache_clear()
    with caplog.at_level(logging.INFO):
        table = ego4d.read_narration_files([path])
        ego4d.read_narration_files([path])  # the same files again in this process: not said twice
    assert len(table) == len(rows)  # kept
    lines = _lines(caplog)
    assert len(lines) == 1, lines
    first = table.where(2).split(" (")[0]
    assert "3 duplicate" in lines[0] and f"{first} (v0)" in lines[0] and "kept" in lines[0], lines
    assert table.where(0).split(" (")[0] in lines[0]


def test_mir_csv_duplicates_are_kept_and_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "chunks"
    (root / "v0").mkdir(parents=True)
    (root / "v0" / "0.mp4").write_bytes(b"")
    row = {"video_id": "v0", "path": "v0/0.mp4", "start_frame": 0, "frames": 300, "fps": 30, "width": 64}
    (root / "manifest.jsonl").write_text(json.dumps(row | {"height": 48, "job": 1}) + "\n")
    csv = tmp_path / "mir.csv"
    body = [
        "m0,P01,v0,00:00:01.00,00:00:01.00,00:00:02.00,cut onion",
        "m1,P01,v0,00:00:01.00,00:00:01.00,00:00:02.00,cut onion",  # duplicate of m0
        "m2,P01,v0,00:00:01.00,00:00:01.00,00:00:03.00,cut onion",
    ]
    csv.write_text(MIR_HEADER + "\n".join(body) + "\n")
    cfg = dataset_config("epic_mir", root=str(root), val_csv=str(csv), num_frames=2, size=32, workers=0)
    with caplog.at_level(logging.INFO):
        ds = build_dataset(cfg, "val")
    assert len(ds) == 3
    lines = _lines(caplog)
    assert len(lines) == 1 and "1 duplicate" in lines[0] and f"{csv}:3 (m1)" in lines[0], lines
    assert f"{csv}:2 (m0)" in lines[0] and "kept" in lines[0], lines


def test_mir_relevancy_as_a_pickled_list_is_converted_and_said(tmp_path: Path) -> None:
    """AVION's relevancy files hold a numpy array; a pickled list of lists is converted, and the data line of
    start-up says so (the key, the file, the shape)."""
    root = tmp_path / "chunks"
    (root / "v0").mkdir(parents=True)
    (root / "v0" / "0.mp4").write_bytes(b"")
    row = {"video_id": "v0", "path": "v0/0.mp4", "start_frame": 0, "frames": 300, "fps": 30, "width": 64}
    (root / "manifest.jsonl").write_text(json.dumps(row | {"height": 48, "job": 1}) + "\n")
    csv, sentences = tmp_path / "mir.csv", tmp_path / "mir_sentence.csv"
    csv.write_text(MIR_HEADER + "".join(f"m{i},P01,v0,0,00:00:0{i}.00,00:00:0{i}.50,cut {i}\n" for i in range(2)))
    sentences.write_text("id,narration\nm0,cut 0\nm1,cut 1\n")
    rel = tmp_path / "rel.pkl"
    cfg = dataset_config("epic_mir", root=str(root), val_csv=str(csv), num_frames=2, size=32, workers=0)
    cfg.val_sentences, cfg.val_relevancy = str(sentences), str(rel)
    rel.write_bytes(pickle.dumps(np.eye(2)))
    ds = build_dataset(cfg, "val")
    assert "pickled list" not in ds.startup_line()
    rel.write_bytes(pickle.dumps([[1.0, 0.0], [0.0, 1.0]]))
    ds = build_dataset(cfg, "val")
    assert isinstance(ds.mir_targets.relevancy, np.ndarray) and ds.mir_targets.relevancy.dtype == np.float64
    line = ds.startup_line()
    assert f"epic_mir.val_relevancy: {rel}: a pickled list" in line and "converted to a float64 (2, 2) array" in line

"""Charades-Ego ``length`` column: a row whose length is not a positive finite number of seconds (nan, inf, -5,
text) is named once, counted and left out, never evaluated; a row whose LaViLa frame ids reach past the video's
last frame (LaViLa's decord raises there and its loader feeds an all-zero clip) is decoded from real frames here
and counted in the eval report (``num_past_end``) and its printed line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from avion_ds.data.datasets.build import build_dataset
from avion_ds.data.datasets.egocentric import lavila_frame_ids
from avion_ds.data.prep.synthetic import write_video
from tests.data.test_egocentric import _cfg
from tests.engine.test_zero_shot import save_tiny_weights

HEADER = "id,subject,scene,quality,relevance,verified,script,objects,descriptions,actions,length\n"
LENGTHS = {"GOODEGO": "4.90", "NANEGO": "nan", "INFEGO": "inf", "NEGEGO": "-5", "PASTEGO": "5.875", "TXTEGO": "abc"}


@pytest.fixture(scope="module")
def charades(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("charades_len")
    (root / "videos").mkdir()
    for vid in LENGTHS:
        write_video(root / "videos" / f"{vid}.mp4", 40, 48, 32, fps=8)
    (root / "Charades_v1_classes.txt").write_text("c000 Holding some clothes\nc001 Opening a door\n")
    csv = root / "CharadesEgo_v1_test_only1st.csv"
    csv.write_text(HEADER + "".join(f'{v},S,K,6,7,Yes,x,a,d,"c001 0.00 2.00",{n}\n' for v, n in LENGTHS.items()))
    return {"root": root / "videos", "csv": csv}


def test_bad_lengths_are_named_counted_and_left_out(charades: dict, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(dataset="charades_ego", root=str(charades["root"]), val_csv=str(charades["csv"]), num_frames=4)
    with caplog.at_level(logging.WARNING):
        ds = build_dataset(cfg, "val")
    assert [ds.row_name(i) for i in range(len(ds))] == ["GOODEGO", "PASTEGO"]
    assert len(ds.bad_rows) == 4
    for vid, line in (("NANEGO", 3), ("INFEGO", 4), ("NEGEGO", 5), ("TXTEGO", 7)):
        assert any(f"{charades['csv']}:{line} ({vid}): length {LENGTHS[vid]!r}" in b for b in ds.bad_rows), ds.bad_rows
    lines = [r.getMessage() for r in caplog.records if "length" in r.getMessage()]
    assert len(lines) == 1 and "4 of 6 rows" in lines[0] and "NANEGO" in lines[0], lines


def test_frames_past_the_video_end_are_real_frames_and_flagged(charades: dict) -> None:
    cfg = _cfg(dataset="charades_ego", root=str(charades["root"]), val_csv=str(charades["csv"]), num_frames=4)
    ds = build_dataset(cfg, "val")
    lavila = lavila_frame_ids(0, 8 * 5.875, 4)
    assert max(lavila) == 40  # == len(vr): LaViLa's get_batch raises, its clip becomes zeros
    good, past = ds[0], ds[1]
    assert good["past_end"] == 0 and past["past_end"] == 1
    assert (past["frames"].float().flatten(1).mean(1) > 10).all()  # real frames, not zeros


def test_eval_reports_bad_rows_and_rows_past_the_end(charades: dict, tmp_path: Path) -> None:
    sets = [f"data.root={charades['root']}", f"data.val_csv={charades['csv']}", "data.val_dataset=charades_ego"]
    sets += ["data.num_frames=4", "data.chunked=false", "data.size=32", "data.decoder=pyav", "data.workers=0"]
    recipe = tmp_path / "zs.yaml"
    recipe.write_text("task: zeroshot\nmodel: {name: clip_vit_test_tiny}\nprecision: fp32\n")
    weights, out = save_tiny_weights(tmp_path / "w.safetensors"), tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "avion_ds.cli", "eval", "--config", recipe, "--checkpoint", weights, "--out", out]
    proc = subprocess.run([*map(str, cmd), *[x for s in sets for x in ("--set", s)]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rows"] == 2 and result["num_bad_rows"] == 4 and result["num_past_end"] == 1
    assert "NANEGO" in result["bad_rows"][0]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("map="))
    assert "1 of 2 rows reach past the video end" in line and "4 annotation rows left out" in line, line

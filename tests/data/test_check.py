"""`avion-ds check`: quarantine.tsv + summary + exit codes; training data skips quarantined rows up front."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import yaml

from avion_ds.cli.check import main as check
from avion_ds.data import build_dataset
from avion_ds.data.datasets.epic import EPIC_REQUIRED
from avion_ds.data.datasets.quarantine import read_quarantine, row_key
from avion_ds.data.errors import DataError


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: r[k] for k in EPIC_REQUIRED} for r in csv.DictReader(f)]


def _write(path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(EPIC_REQUIRED))
        w.writeheader()
        w.writerows(rows)


def _recipe(tmp_path, cfg) -> str:
    data = {
        "model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}},
        "data": {
            "dataset": "epic",
            "root": cfg.root,
            "train_csv": cfg.train_csv,
            "val_csv": cfg.val_csv,
            "num_frames": 4,
            "size": 32,
            "decode_timeout_s": 0.0,
        },
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _loads(ds, i) -> bool:
    try:
        ds[i]
        return True
    except DataError:
        return False


def test_check_quarantines_bad_chunks_and_rows_and_training_skips_them(epic_copy, epic_raw, tmp_path, capsys):
    root, cfg = epic_copy
    assert check([_recipe(tmp_path, cfg), "--workers", "1"]) == 0  # healthy copy: exit 0, no quarantine file
    assert not (root / "quarantine.tsv").exists()
    assert json.loads((root / "check_summary.json").read_text())["quarantined"] == 0

    rows = _rows(epic_raw["train_csv"])
    vid = rows[0]["video_id"]
    bad_chunk = root / vid / "3.mp4"  # frames 45..89 (3 s..6 s) of that video
    bad_chunk.write_bytes(bad_chunk.read_bytes()[:500])
    rows.append(dict(rows[0], narration_id="ghost", video_id="P77_777"))
    rows.append(dict(rows[0], narration_id="backwards", start_timestamp="00:00:03.00", stop_timestamp="00:00:01.00"))
    rows.append(dict(rows[0], narration_id="after_end", start_timestamp="00:01:00.00", stop_timestamp="00:01:02.00"))
    train = tmp_path / "train.csv"
    _write(train, rows)
    cfg = replace(cfg, train_csv=str(train))
    assert check([_recipe(tmp_path, cfg), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "quarantined" in out and f"QUARANTINED {vid}/3.mp4: file does not match its manifest row" in out
    q = read_quarantine(root / "quarantine.tsv")
    n = len(rows)
    assert q[row_key(train, n - 1)].startswith("video 'P77_777' not found")
    assert "stop_timestamp 00:00:01.00 is before start_timestamp" in q[row_key(train, n)]
    assert "lie outside the video" in q[row_key(train, n + 1)]
    assert set(q) == {f"{vid}/3.mp4", row_key(train, n - 1), row_key(train, n), row_key(train, n + 1)}
    summary = json.loads((root / "check_summary.json").read_text())
    assert summary["quarantined"] == 4 and summary["annotation_rows"]["train"] == len(rows)

    # independent reference: which rows actually fail when every clip is read with no quarantine at all
    raw = build_dataset(replace(cfg, quarantine="none", on_error="raise"), "train")
    failing = {raw.row_name(i) for i in range(len(raw)) if not _loads(raw, i)}
    ds = build_dataset(replace(cfg, on_error="raise"), "train")  # quarantine: auto -> root/quarantine.tsv
    kept = {ds.row_name(i) for i in range(len(ds))}
    assert not failing & kept  # nothing that fails to load is left
    assert {"backwards", "after_end"}.isdisjoint(kept) and "ghost" not in kept
    touched = {
        r["narration_id"]
        for r in rows[:-3]
        if r["video_id"] == vid and not (_sec(r["stop_timestamp"]) <= 3.0 or _sec(r["start_timestamp"]) >= 6.0)
    }
    assert touched and touched.isdisjoint(kept)  # rows whose span reads the bad chunk are skipped
    assert kept == {r["narration_id"] for r in rows[:-3]} - touched  # and only those
    assert len(ds.missing) == 1 and len(ds.quarantined) == 2 + len(touched)
    assert ds.startup_line() == (
        f"train: {len(ds)} samples; skipped up front: 1 rows with missing videos, {2 + len(touched)} quarantined rows"
    )


def _sec(ts: str) -> float:
    h, m, s = ts.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def test_check_out_elsewhere_says_what_training_reads(epic_copy, epic_raw, tmp_path, capsys) -> None:
    """--out ELSEWHERE: training (data.quarantine: auto) reads <root>/quarantine.tsv, not this list; say so."""
    root, cfg = epic_copy
    vid = _rows(epic_raw["train_csv"])[0]["video_id"]
    chunk = root / vid / "3.mp4"
    chunk.write_bytes(chunk.read_bytes()[:500])
    elsewhere = tmp_path / "elsewhere" / "quarantine.tsv"
    recipe = _recipe(tmp_path, cfg)
    assert check([recipe, "--workers", "1", "--out", str(elsewhere.parent)]) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("quarantine list:"))
    assert "training skips these rows" not in line
    assert f"training reads {root / 'quarantine.tsv'} (data.quarantine: auto), not this file" in line
    assert f"--set data.quarantine={elsewhere}" in line
    assert build_dataset(replace(cfg, quarantine=str(elsewhere)), "train").quarantined  # the advice works
    assert check([recipe, "--workers", "1"]) == 1  # default: the data root, which training reads
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("quarantine list:"))
    assert f"quarantine list: {root / 'quarantine.tsv'} (training skips these rows;" in line


def test_check_a_chunk_directory_sampled_and_full(epic_copy, tmp_path, capsys) -> None:
    root, _ = epic_copy
    recs = [json.loads(x) for x in (root / "manifest.jsonl").read_text().splitlines()]
    recs[-1]["frames"] += 5  # the manifest claims frames the file does not have
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for mode in ([], ["--full"]):
        assert check([str(root), "--workers", "2", "--out", str(tmp_path / "o"), *mode]) == 1
        q = read_quarantine(tmp_path / "o" / "quarantine.tsv")
        assert list(q) == [recs[-1]["path"]], q
    assert "decoded" in q[recs[-1]["path"]]
    assert check([str(tmp_path / "nothing_here")]) == 2
    assert "neither a recipe file nor a chunk directory" in capsys.readouterr().err


def test_check_whole_videos_recipe(tmp_path, capsys) -> None:
    from avion_ds.data.prep.synthetic import write_video

    root = tmp_path / "videos"
    write_video(root / "a" / "v1.mp4", 12, 32, 32, fps=10)
    write_video(root / "b" / "v2.mp4", 12, 32, 32, fps=10)
    lst = tmp_path / "list.txt"
    lst.write_text("a/v1.mp4 0\nb/v2.mp4 1\nc/v3.mp4 1\n")
    data = {
        "model": {"name": "vit_test_tiny"},
        "data": {
            "dataset": "kinetics",
            "root": str(root),
            "chunked": False,
            "train_csv": str(lst),
            "val_csv": "",
            "num_frames": 4,
            "size": 32,
            "decode_timeout_s": 0.0,
        },
    }
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(data))
    (root / "b" / "v2.mp4").write_bytes(b"")
    assert check([str(recipe), "--workers", "1"]) == 1
    q = read_quarantine(root / "quarantine.tsv")
    assert q[row_key(lst, 3)].startswith("video 'c/v3.mp4' not found")
    assert "zero-byte file" in q[row_key(lst, 2)]  # the row cannot resolve its (empty) video
    assert set(q) == {row_key(lst, 2), row_key(lst, 3)}
    ds = build_dataset(replace(_recipe_data(recipe), on_error="raise"), "train")
    assert len(ds) == 1 and ds[0]["label"] == 0 and len(ds.missing) == 1 and len(ds.quarantined) == 1


def _recipe_data(path):
    from avion_ds.tasks import load_recipe

    return load_recipe(path).data

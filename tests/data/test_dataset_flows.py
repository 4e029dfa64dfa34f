"""Tiny K400-style, SSv2-style (webm) and EPIC-style datasets through the README flow with the shipped
recipes: chunk -> check (corrupted entries quarantined) -> train 1 step -> eval with the recipe's protocol;
the eval JSON lists missing, quarantined and failed samples."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from avion_ds.data.datasets.kinetics import kinetics_stem
from avion_ds.data.datasets.quarantine import read_quarantine
from avion_ds.data.prep.synthetic import make_synthetic_epic, write_video
from tests.helpers import REPO, launch, run_process

pytestmark = pytest.mark.multiprocess
TINY = [
    "model.name=vit_test_tiny",
    "model.pretrained=null",
    "model.activation_checkpointing=false",
    "batch.global_batch=2",
    "batch.micro_batch=2",
    "eval.batch_size=2",
    "schedule.epochs=1",
    "schedule.steps_per_epoch=1",
    "schedule.warmup_epochs=0",
    "eval.every_epochs=1",
    "data.workers=0",
    "data.decode_timeout_s=0",
    "logging.tensorboard=false",
    "logging.progress=false",
    "precision=fp32",
    "checkpoint.every_steps=0",
]


def _cli(*args: str, timeout: int = 300) -> str:
    proc = run_process([sys.executable, "-m", "avion_ds.cli", *args], timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{args[:2]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _sets(values: list[str]) -> list[str]:
    return [x for v in values for x in ("--set", v)]


def _inproc(capsys, *args: str) -> tuple[int, str]:
    """`avion-ds chunk|check` in this process (no interpreter start-up); (exit code, stdout)."""
    from avion_ds.cli import main

    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def _flow(
    capsys, tmp: Path, recipe: str, src: Path, data: list[str], corrupt: str, fail: str, standalone_eval: bool = False
) -> tuple[dict, str]:
    """chunk SRC; corrupt one chunk; check (exit 1, quarantined); corrupt another (missed by the check);
    train 1 step + its eval; optionally `avion-ds eval` too. Returns (eval report, train log)."""
    chunks = tmp / "chunks"
    assert (
        _inproc(
            capsys,
            "chunk",
            str(src),
            str(chunks),
            "--chunk-seconds",
            "2",
            "--short-side",
            "48",
            "--fps",
            "10",
            "--gop",
            "5",
            "--workers",
            "1",
            "--no-progress",
        )[0]
        == 0
    )
    bad = chunks / corrupt
    bad.write_bytes(bad.read_bytes()[:200])  # a damaged file: caught by the check
    sets = [*TINY, f"data.root={chunks}", f"output_dir={tmp / 'run'}", *data]
    code, out = _inproc(capsys, "check", str(REPO / "launch" / "recipes" / recipe), "--workers", "1", *_sets(sets))
    assert code == 1, out
    assert f"QUARANTINED {corrupt}: file does not match its manifest row" in out
    assert corrupt in read_quarantine(chunks / "quarantine.tsv")
    (chunks / fail).write_bytes(b"\x00" * 64)  # broken after the check: evaluation reports it as failed
    proc = launch(
        [
            "--config",
            REPO / "launch" / "recipes" / recipe,
            "--deepspeed_config",
            REPO / "ds_configs" / "zero0.json",
            *_sets(sets),
        ],
        nprocs=1,
        launcher="python",
        timeout=400,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    report = json.loads((tmp / "run" / "metrics.json").read_text())["eval"]
    if standalone_eval:
        ev = tmp / "eval.json"
        _cli("eval", "--checkpoint", str(tmp / "run"), "--out", str(ev), timeout=400)
        full = json.loads(ev.read_text())
        assert {k: full[k] for k in report} == report  # the same report from `avion-ds eval`
    return report, log


def _videos(folder: Path, names: list[str], frames: int = 30) -> None:
    for n in names:
        write_video(folder / n, frames, 64, 48, fps=10, gop=5)


def test_k400_style(tmp_path: Path, capsys) -> None:
    rows = [
        ("abseiling", "tr_a", 0, 10, "train"),
        ("air drumming", "tr_b", 3, 13, "train"),
        ("abseiling", "va_ok", 1, 11, "validate"),
        ("air drumming", "va_missing", 2, 12, "validate"),
        ("abseiling", "va_bad", 4, 14, "validate"),
        ("air drumming", "va_fail", 5, 15, "validate"),
    ]
    for label, yt, a, b, _ in rows:
        if yt != "va_missing":  # a real K400 copy lacks some videos
            _videos(tmp_path / "k400" / label, [f"{kinetics_stem(yt, a, b)}.mp4"])
    for split in ("train", "validate"):
        with (tmp_path / f"{split}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["label", "youtube_id", "time_start", "time_end", "split"])
            w.writerows(r for r in rows if r[4] == split)
    data = [f"data.train_csv={tmp_path / 'train.csv'}", f"data.val_csv={tmp_path / 'validate.csv'}"]
    ev, log = _flow(
        capsys,
        tmp_path,
        "vit_b_k400.yaml",
        tmp_path / "k400",
        data,
        corrupt="va_bad_000004_000014/2.mp4",
        fail="va_fail_000005_000015/0.mp4",
        standalone_eval=True,
    )
    # va_fail's chunk was broken after the check: start-up's sample of rows names it beside the dropped rows
    assert re.search(
        r"data val: 2 samples; skipped up front: 1 rows with missing videos, 1 quarantined rows; "
        r"1 of 2 sampled rows read chunk files not as listed \(first: \S*va_fail_000005_000015/0\.mp4: .*\(listed in",
        log,
    ), log[-3000:]
    listed = (tmp_path / "run" / "skipped_rows_val.txt").read_text().splitlines()
    assert len(listed) == 2 and "va_missing_000002_000012" in listed[0] and "va_bad_000004_000014" in listed[1]
    assert (ev["protocol"], ev["views"], ev["protocol_settings"]["temporal_views"]) == ("k400", 15, 5)
    assert ev["annotation_rows"] == 4 and ev["samples_evaluated"] == 1
    assert ev["num_missing"] == 1 and "va_missing_000002_000012" in ev["missing"][0]
    assert ev["num_quarantined"] == 1 and "va_bad_000004_000014" in ev["quarantined"][0]
    assert ev["failed"] == ["va_fail_000005_000015"]


def test_ssv2_style_webm(tmp_path: Path, transcode, capsys) -> None:
    labels = {"Pushing something from left to right": "0", "Pushing something from right to left": "1"}
    tpl = ["Pushing [something] from left to right", "Pushing [something] from right to left"]
    src = tmp_path / "ssv2"
    mp4 = write_video(tmp_path / "tmp.mp4", 30, 64, 48, fps=10, gop=5)
    ids = {"train": ["1", "2"], "validation": ["3", "4", "5", "6"]}
    for vid in ids["train"] + ids["validation"]:
        if vid != "4":  # missing
            transcode(mp4, src / f"{vid}.webm", "libvpx-vp9" if int(vid) % 2 else "libvpx", "webm")
    ann = tmp_path / "labels"
    ann.mkdir()
    (ann / "labels.json").write_text(json.dumps(labels))
    for split, vids in ids.items():
        (ann / f"{split}.json").write_text(
            json.dumps([{"id": v, "label": "x", "template": tpl[int(v) % 2], "placeholders": ["x"]} for v in vids])
        )
    data = [f"data.train_csv={ann / 'train.json'}", f"data.val_csv={ann / 'validation.json'}"]
    ev, log = _flow(capsys, tmp_path, "vit_b_ssv2.yaml", src, data, corrupt="5/0.mp4", fail="6/2.mp4")
    assert "data val: 2 samples; skipped up front: 1 rows with missing videos, 1 quarantined rows" in log
    assert (ev["protocol"], ev["views"]) == ("ssv2", 6)
    assert (ev["samples_evaluated"], ev["num_missing"], ev["num_quarantined"], ev["failed"]) == (1, 1, 1, ["6"])


def test_epic_style(tmp_path: Path, capsys) -> None:
    raw = make_synthetic_epic(
        tmp_path / "epic",
        num_videos=2,
        segments_per_video=4,
        segment_seconds=1.5,
        width=64,
        height=48,
        fps=10,
        seed=3,
        val_fraction=0.5,
    )
    with open(raw["val_csv"], newline="") as f:
        val = list(csv.DictReader(f))
    extra = dict(val[0], narration_id="P09_999_0", video_id="P09_999")  # its video was never downloaded
    with open(raw["val_csv"], "a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(val[0])).writerow(extra)
    data = [f"data.train_csv={raw['train_csv']}", f"data.val_csv={raw['val_csv']}"]
    # 6 s videos in 2 s chunks; val rows (seed 3): P01_101_1 1.6-2.9 s, P01_101_2 3.1-4.4 s (both read
    # P01_101/2.mp4), P02_102_0 0.1-1.4 s (P02_102/0.mp4), P02_102_1 1.6-2.9 s (also P02_102/2.mp4)
    assert [r["narration_id"] for r in val] == ["P01_101_1", "P01_101_2", "P02_102_0", "P02_102_1"]
    ev, log = _flow(
        capsys, tmp_path, "vit_b_epic.yaml", raw["videos"], data, corrupt="P01_101/2.mp4", fail="P02_102/2.mp4"
    )
    assert "data val: 2 samples; skipped up front: 1 rows with missing videos, 2 quarantined rows" in log
    assert (ev["protocol"], ev["views"], ev["annotation_rows"], ev["samples_evaluated"]) == ("epic", 1, 5, 1)
    assert ev["num_missing"] == 1 and "P09_999_0" in ev["missing"][0]
    assert [q.split(" (")[1].split(")")[0] for q in ev["quarantined"]] == ["P01_101_1", "P01_101_2"]
    assert ev["failed"] == ["P02_102_1"]

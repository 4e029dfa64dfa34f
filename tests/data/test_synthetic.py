"""Synthetic videos: frame-index barcodes survive encoding; the EPIC-style set is well formed."""

from __future__ import annotations

import csv

import pytest

from avion_ds.cli import synth as synth_cli
from avion_ds.data.prep import synthetic
from avion_ds.data.prep.synthetic import read_frame_index
from avion_ds.data.sampling import parse_timestamp


def test_write_video_frames_carry_their_index(index_video, decode_all) -> None:
    frames = decode_all(index_video)
    assert frames.shape == (150, 72, 96, 3)
    assert [read_frame_index(f) for f in frames.numpy()] == list(range(150))


def test_write_video_rejects_odd_size(tmp_path) -> None:
    with pytest.raises(ValueError, match="must be even"):
        synthetic.write_video(tmp_path / "odd.mp4", 3, 33, 32)


def test_synthetic_epic_csvs(epic_raw, decode_all) -> None:
    rows = []
    for key in ("train_csv", "val_csv"):
        with open(epic_raw[key], newline="") as f:
            rows += list(csv.DictReader(f))
    assert len(rows) == 12 and epic_raw["num_train"] + epic_raw["num_val"] == 12
    assert {r["video_id"] for r in rows} == {p.stem for p in epic_raw["videos"].glob("*.mp4")}
    for r in rows:
        start, stop = parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"])
        assert 0 <= start < stop
        assert 0 <= int(r["verb_class"]) < epic_raw["num_verbs"] and 0 <= int(r["noun_class"]) < epic_raw["num_nouns"]
    assert len(decode_all(next(epic_raw["videos"].glob("*.mp4")))) == 6 * 30  # 6 segments x 2 s x 15 fps


def test_shapes_move_as_their_verb_says() -> None:
    """Verb 0 (up) moves the shape's centre up, verb 2 (grow) grows it: the labels are learnable."""
    import numpy as np

    yy, xx = np.mgrid[0:48, 0:64].astype(np.float32)
    y0, _, _ = synthetic.segment_track(0, 0.0, 64, 48, (0.0, 0.0))
    y1, _, _ = synthetic.segment_track(0, 1.0, 64, 48, (0.0, 0.0))
    assert y1 < y0 - 20
    area = [
        synthetic.shape_mask(0, yy, xx, 24, 32, synthetic.segment_track(2, t, 64, 48, (0, 0))[2]).sum()
        for t in (0.0, 1.0)
    ]
    assert area[1] > 4 * area[0]


def test_synth_cli(tmp_path, capsys) -> None:
    assert (
        synth_cli.main(
            [
                str(tmp_path / "s"),
                "--num-videos",
                "1",
                "--segments-per-video",
                "2",
                "--segment-seconds",
                "0.5",
                "--width",
                "32",
                "--height",
                "32",
            ]
        )
        == 0
    )
    assert (tmp_path / "s" / "train.csv").is_file() and (tmp_path / "s" / "videos").is_dir()
    assert (
        synth_cli.main([str(tmp_path / "bad"), "--num-verbs", "99"]) == 2
    )  # bad input: exit 2 (one convention for every subcommand)
    assert "num_verbs" in capsys.readouterr().err


def test_smooth_background_is_a_linear_ramp(tmp_path, decode_all) -> None:
    """``background="smooth"``: away from the shape every channel of a frame is a plane in (y, x) (what
    masked pretraining can predict); the default ``blocks`` background is not."""
    import numpy as np

    def planar_share(background: str) -> float:
        info = synthetic.make_synthetic_epic(
            tmp_path / background,
            num_videos=1,
            segments_per_video=2,
            segment_seconds=0.5,
            width=64,
            height=48,
            fps=12,
            background=background,
        )
        frame = decode_all(next(info["videos"].glob("*.mp4")))[0].numpy().astype(np.float64)
        yy, xx = np.mgrid[0:48, 0:64]
        design = np.stack([yy.ravel(), xx.ravel(), np.ones(yy.size)], axis=1)
        near = []
        for c in range(3):
            v = frame[..., c].ravel()
            fit = np.linalg.lstsq(design, v, rcond=None)[0]
            near.append(np.abs(design @ fit - v) < 8)
        return float(np.mean(np.all(near, axis=0)))

    assert planar_share("smooth") > 0.8  # the shape and its trail cover the rest
    assert planar_share("blocks") < 0.3
    assert synth_cli.main([str(tmp_path / "bad"), "--background", "stripes"]) == 2

"""Tiny generated datasets for tests that train (seconds to make; no downloads)."""

from __future__ import annotations

from pathlib import Path


def tiny_epic_data(root: Path, num_videos: int = 3, background: str = "blocks") -> dict:
    """Synthetic EPIC-style videos (15 one-second segments each, 64x48 at 12 fps, seed 1; a quarter of the
    rows in the val CSV) cut into 6 s chunks under ``root/chunks``. Returns {"root" (the chunks),
    "train_csv", "val_csv", "num_train", "num_val"}."""
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic

    info = make_synthetic_epic(
        root / "synth",
        num_videos=num_videos,
        segments_per_video=15,
        segment_seconds=1.0,
        width=64,
        height=48,
        fps=12,
        val_fraction=0.25,
        seed=1,
        background=background,
    )
    summary = chunk_videos(
        info["videos"], root / "chunks", chunk_seconds=6.0, short_side=48, fps=12, gop=12, progress=False
    )
    assert not summary.failed, summary
    return {
        "root": root / "chunks",
        "train_csv": info["train_csv"],
        "val_csv": info["val_csv"],
        "num_train": info["num_train"],
        "num_val": info["num_val"],
    }


def val_subset(data: dict, num_val: int, csv_path: Path) -> dict:
    """``data`` with its val CSV cut to the header + the first ``num_val`` rows (written to ``csv_path``)."""
    rows = Path(data["val_csv"]).read_text().splitlines()
    csv_path.write_text("\n".join(rows[: num_val + 1]) + "\n")
    return {**data, "val_csv": csv_path, "num_val": num_val}


def placeholder_chunks(root: Path) -> Path:
    """A chunk root ``root`` of one video ``v0`` in two 5 s chunks (30 fps, 64x48) whose files are empty
    placeholders: start-up checks only stat them, so tests of start-up need no real video."""
    import json

    (root / "v0").mkdir(parents=True)
    rows = []
    for k in range(2):
        (root / "v0" / f"{k * 5}.mp4").write_bytes(b"")
        rows.append(
            {"video_id": "v0", "path": f"v0/{k * 5}.mp4", "start_frame": 150 * k, "frames": 150, "fps": 30}
            | {"width": 64, "height": 48, "job": 1}
        )
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root

"""A chunk listed in manifest.jsonl but missing (or unreadable) on disk is a bad sample under every decoder,
``data.decoder: auto`` included: named, counted, skipped or raised under ``data.on_error``, never a crash."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from avion_ds.data import build_dataset
from avion_ds.data.decode.select import available_backends, pick_decoder
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest_index import load_manifest


def _first_chunk_rows(ds) -> tuple[Path, list[int]]:
    """The first chunk of the first video, and the rows whose clip reads it."""
    entry = load_manifest(ds.cfg.root)[min(load_manifest(ds.cfg.root))]
    chunk = entry.chunks[0]
    rows = []
    for i in range(len(ds)):
        e, start, _, _ = ds.sample_span(i)
        if e.video_id == entry.video_id and start < chunk.start_frame + chunk.frames:
            rows.append(i)
    return Path(chunk.path), rows


@pytest.mark.parametrize("decoder", ["auto", *available_backends()])
@pytest.mark.parametrize("damage", ["deleted", "directory"])
def test_missing_chunk_is_a_bad_sample_under_every_decoder(epic_copy, decoder: str, damage: str) -> None:
    _, cfg = epic_copy
    cfg = replace(cfg, decoder=decoder, on_error="raise")
    ds = build_dataset(cfg, "train")
    path, rows = _first_chunk_rows(ds)
    assert rows
    path.unlink()
    if damage == "directory":
        path.mkdir()
    why = "file not found" if damage == "deleted" else "not a regular file"
    with pytest.raises(DataError) as err:
        ds[rows[0]]
    assert str(err.value).startswith(str(path)) and why in str(err.value) and "\n" not in str(err.value)
    skip = build_dataset(replace(cfg, on_error="skip"), "train")
    item = skip[rows[0]]
    assert item["skipped"] >= 1 and item["failed_index"] == rows[0] and why in item["failed_reason"]
    assert skip.errors == item["skipped"]


def test_auto_probes_past_a_missing_first_chunk(epic_copy) -> None:
    """pick_decoder's probe skips chunks that are not on disk instead of dying in Path.stat."""
    root, cfg = epic_copy
    videos = load_manifest(root)
    first = videos[min(videos)].chunks[0]
    Path(first.path).unlink()
    name, why = pick_decoder(replace(cfg, decoder="auto"))
    assert name in available_backends(cuda=True) and first.path not in why


def test_auto_with_no_chunk_on_disk_is_one_line(epic_copy) -> None:
    root, cfg = epic_copy
    for entry in load_manifest(root).values():
        for c in entry.chunks:
            Path(c.path).unlink()
    with pytest.raises(ValueError, match="no chunk listed under .* is on disk to probe"):
        pick_decoder(replace(cfg, decoder="auto"))

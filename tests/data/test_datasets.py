"""EPIC and Kinetics datasets: items, determinism, one crop per clip across chunks, views, bad input."""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import replace

import pytest
import torch

from avion_ds.config import DataConfig
from avion_ds.data import build_dataset
from avion_ds.data.crop import clip_rng, crop_resize, random_resized_crop
from avion_ds.data.datasets.epic import EPIC_REQUIRED
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.synthetic import read_frame_index
from avion_ds.data.sampling import map_to_chunks, stride_indices


def test_epic_item(epic_cfg) -> None:
    ds = build_dataset(epic_cfg, "train")
    assert len(ds) == 8 and ds.num_classes == {"verb": 4, "noun": 3}
    item = ds[0]
    assert item["frames"].dtype == torch.uint8 and item["frames"].shape == (4, 32, 32, 3)
    assert set(item["label"]) == {"verb", "noun"} and item["index"] == 0 and item["skipped"] == 0
    assert ds.errors == 0


def test_same_seed_epoch_index_same_clip_new_epoch_new_clip(epic_cfg) -> None:
    a, b = build_dataset(epic_cfg, "train", seed=3), build_dataset(epic_cfg, "train", seed=3)
    assert torch.equal(a[5]["frames"], b[5]["frames"])
    b.set_epoch(1)
    assert not torch.equal(a[5]["frames"], b[5]["frames"])
    a.set_epoch(1)
    assert torch.equal(a[5]["frames"], b[5]["frames"])
    v1, v2 = build_dataset(epic_cfg, "val"), build_dataset(epic_cfg, "val", seed=9)
    assert torch.equal(v1[1]["frames"], v2[1]["frames"])  # eval is deterministic regardless of seed


def test_one_crop_per_clip_across_chunks(index_chunks, decode_all, tmp_path, monkeypatch) -> None:
    """A clip spanning two chunks is cut with ONE box (AVION sampled one per chunk)."""
    lst = tmp_path / "list.txt"
    lst.write_text("idx.mp4 0\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(index_chunks),
        train_csv=str(lst),
        val_csv=str(lst),
        num_frames=8,
        sampling="stride",
        stride=3,
        size=24,
        decode_timeout_s=0.0,
    )
    ds = build_dataset(cfg, "train", seed=1)
    entry = load_manifest(index_chunks)["idx"]
    for i in range(6):
        ds.set_epoch(i)  # find a draw that crosses a chunk boundary
        rng = clip_rng(1, i, 0, 0)
        idx = stride_indices(0, entry.num_frames, 8, 3, train=True, rng=rng)
        if len(map_to_chunks(idx, entry)) > 1:
            break
    else:
        pytest.fail("no boundary-crossing clip drawn")
    box = random_resized_crop(72, 96, (0.5, 1.0), (0.75, 1.3333333), rng)
    seen = []
    real = type(ds.decoder).decode
    monkeypatch.setattr(
        type(ds.decoder), "decode", lambda self, p, ind, crop=None: seen.append(crop) or real(self, p, ind, crop)
    )
    frames = ds[0]["frames"]
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0].box == box
    want = crop_resize(decode_all(index_chunks.parent / "src" / "idx.mp4")[idx], box, (24, 24))
    assert (frames.float() - want.float()).abs().mean() < 6.0


def test_clip_frames_come_from_the_right_chunk_and_clamp(index_chunks, tmp_path) -> None:
    """Uncropped reads: barcodes show the global frame indices, across chunks and clamped past the end."""
    lst = tmp_path / "list.csv"
    lst.write_text("path,label\nidx.mp4,1\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(index_chunks),
        train_csv=str(lst),
        val_csv=str(lst),
        num_frames=8,
        sampling="segment",
        size=72,
        decode_timeout_s=0.0,
    )
    ds = build_dataset(cfg, "val")
    assert ds[0]["frames"].shape == (8, 72, 72, 3)  # centre square of the 96x72 chunks
    entry = load_manifest(index_chunks)["idx"]
    idx = [0, 29, 30, 59, 60, 149, 151]
    got = []
    for path, local in map_to_chunks(idx, entry):
        got += [read_frame_index(f) for f in ds.decoder.decode(path, local).numpy()]
    assert got == [0, 29, 30, 59, 60, 149, 149]  # 2 frames past the end clamp; 10 would be a bad sample
    with pytest.raises(DataError, match="frame 160 of video idx is 11 frames past the last decodable frame 149"):
        map_to_chunks([0, 160], entry)


def test_kinetics_list_formats_and_whole_videos(index_video, index_chunks, tmp_path) -> None:
    src_root = index_video.parent
    for text in ("idx.mp4 2\n", "idx.mp4,2\n", "path,label\nidx.mp4,2\n"):
        lst = tmp_path / "l.txt"
        lst.write_text(text)
        for root, chunked in ((index_chunks, True), (src_root, False)):
            cfg = DataConfig(
                dataset="kinetics",
                root=str(root),
                chunked=chunked,
                train_csv=str(lst),
                val_csv=str(lst),
                num_frames=4,
                sampling="stride",
                stride=4,
                size=32,
                decode_timeout_s=0.0,
            )
            ds = build_dataset(cfg, "train")
            item = ds[0]
            assert ds.num_classes == 3 and item["label"] == 2 and item["frames"].shape == (4, 32, 32, 3)


def test_epic_whole_videos(epic_raw, epic_cfg) -> None:
    cfg = replace(epic_cfg, root=str(epic_raw["videos"]), chunked=False)
    ds = build_dataset(cfg, "val", temporal_views=2)
    assert ds[0]["frames"].shape == (2, 4, 32, 32, 3)


@pytest.mark.parametrize("dataset", ["epic", "kinetics"])
def test_multi_view_shapes(dataset, epic_cfg, index_chunks, tmp_path) -> None:
    if dataset == "kinetics":
        lst = tmp_path / "k.txt"
        lst.write_text("idx.mp4 0\n")
        epic_cfg = DataConfig(
            dataset="kinetics",
            root=str(index_chunks),
            train_csv=str(lst),
            val_csv=str(lst),
            num_frames=4,
            sampling="stride",
            stride=2,
            size=32,
            decode_timeout_s=0.0,
        )
    ds = build_dataset(epic_cfg, "val", temporal_views=2, spatial_views=3)
    frames = ds[0]["frames"]
    assert frames.shape == (6, 4, 32, 32, 3)
    assert not torch.equal(frames[0], frames[2])  # left vs right crop
    assert not torch.equal(frames[0], frames[3])  # temporal view 0 vs 1


def test_malformed_header_fails_at_construction(epic_cfg, tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("narration_id,video_id,start_timestamp,stop_time,verb_class,noun_class\n")
    with pytest.raises(ValueError, match=r"bad.csv: missing column\(s\) stop_timestamp"):
        build_dataset(replace(epic_cfg, train_csv=str(bad)), "train")
    lst = tmp_path / "k.csv"
    lst.write_text("path,lbl\na.mp4,1\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) label"):
        build_dataset(replace(epic_cfg, dataset="kinetics", train_csv=str(lst), val_csv=""), "train")


def _write_rows(path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(EPIC_REQUIRED))
        w.writeheader()
        w.writerows(rows)


def _good_row(epic_raw) -> dict:
    with open(epic_raw["train_csv"], newline="") as f:
        r = next(csv.DictReader(f))
    return {k: r[k] for k in EPIC_REQUIRED}


def _damage(case: str, root, epic_raw, tmp_path) -> tuple[dict, str]:
    """Make row 0 of a one-good-row CSV bad in way ``case``; returns (row0, expected reason)."""
    good = _good_row(epic_raw)
    vid = good["video_id"]
    chunk = root / vid / "0.mp4"
    row = dict(good)
    if case == "missing":
        chunk.unlink()
        return row, f"{chunk}: file not found"
    if case == "zero_byte":
        chunk.write_bytes(b"")
        return row, f"{chunk}: zero-byte file"
    if case == "truncated":  # refused before decoding: its size no longer matches the manifest row
        chunk.write_bytes(chunk.read_bytes()[:300])
        return row, f"{chunk}: file does not match its manifest row (size 300 vs"
    if case == "not_video":
        chunk.write_text("hello\n" * 100)
        return row, f"{chunk}: file does not match its manifest row (size 600 vs"
    if case == "short_chunk":
        recs = [json.loads(x) for x in (root / "manifest.jsonl").read_text().splitlines()]
        for r in recs:  # manifest claims more frames than the last chunk (9 s..12 s) decodes
            if r["video_id"] == vid and r["start_frame"] == 135:
                r["frames"] += 40
        (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        row["start_timestamp"], row["stop_timestamp"] = "00:00:11.00", "00:00:14.50"
        return row, f"{root / vid / '9.mp4'}: only 45 decodable frames"
    if case == "past_the_end":  # the video (12 s) is shorter than the annotation: frozen frames otherwise
        row["start_timestamp"], row["stop_timestamp"] = "00:00:11.00", "00:00:20.00"
        return row, "frames past the last decodable frame"
    if case == "stop_before_start":
        row["start_timestamp"], row["stop_timestamp"] = "00:00:02.00", "00:00:01.00"
        return row, "stop_timestamp 00:00:01.00 is before start_timestamp 00:00:02.00"
    raise AssertionError(case)


CASES = ["missing", "zero_byte", "truncated", "not_video", "short_chunk", "past_the_end", "stop_before_start"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_skipped_with_one_log_line(case, epic_copy, epic_raw, tmp_path, caplog) -> None:
    root, cfg = epic_copy
    row, reason = _damage(case, root, epic_raw, tmp_path)
    good = _good_row(epic_raw)
    good["start_timestamp"], good["stop_timestamp"] = "00:00:06.10", "00:00:07.90"  # in a healthy chunk
    csv_path = tmp_path / "rows.csv"
    _write_rows(csv_path, [row, good])
    cfg = replace(cfg, train_csv=str(csv_path), val_csv="")
    ds = build_dataset(cfg, "train")
    with caplog.at_level(logging.WARNING, logger="avion_ds.data.datasets.video_clips"):
        item = ds[0]
    assert item["index"] == 1 and item["skipped"] >= 1 and ds.errors == item["skipped"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == item["skipped"] and all(reason in ln and "skipping sample 0" in ln for ln in lines)
    assert "\n" not in lines[0]

    with pytest.raises(DataError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        build_dataset(replace(cfg, on_error="raise"), "train")[0]


def test_unknown_videos_are_dropped_listed_and_counted_at_start(epic_copy, epic_raw, tmp_path, caplog) -> None:
    _root, cfg = epic_copy
    good, bad = _good_row(epic_raw), dict(_good_row(epic_raw), video_id="P99_999", narration_id="P99_999_0")
    csv_path = tmp_path / "rows.csv"
    _write_rows(csv_path, [bad, good, dict(bad, narration_id="P99_999_1")])
    with caplog.at_level(logging.WARNING, logger="avion_ds.data.datasets.video_clips"):
        ds = build_dataset(replace(cfg, train_csv=str(csv_path), val_csv="", on_error="raise"), "train")
    assert len(ds) == 1 and ds.row_name(0) == good["narration_id"] and ds[0]["skipped"] == 0
    assert len(ds.missing) == 2 and all("video 'P99_999' not found" in m for m in ds.missing)
    assert "P99_999_0" in ds.missing[0] and f"{csv_path}:2" in ds.missing[0]
    assert [r.getMessage() for r in caplog.records if "annotation rows usable" in r.getMessage()] == [
        f"train split: 1 of 3 annotation rows usable; 2 missing videos, 0 quarantined; first: {ds.missing[0]}"
    ]
    with pytest.raises(ValueError, match="none of its 1 rows is usable"):
        _write_rows(csv_path, [bad])
        build_dataset(replace(cfg, train_csv=str(csv_path), val_csv=""), "train")


def test_split_summary_is_logged_on_rank_0_only(epic_copy, epic_raw, tmp_path, caplog, monkeypatch) -> None:
    """Every rank builds the datasets; the 'N of M annotation rows usable' line comes from rank 0 alone."""
    import torch.distributed as tdist

    _root, cfg = epic_copy
    good, bad = _good_row(epic_raw), dict(_good_row(epic_raw), video_id="P99_999", narration_id="P99_999_0")
    csv_path = tmp_path / "rows.csv"
    _write_rows(csv_path, [bad, good])
    cfg = replace(cfg, train_csv=str(csv_path), val_csv="")

    def summaries(rank: int | None, env_rank: str) -> list[str]:
        monkeypatch.setenv("RANK", env_rank)
        monkeypatch.setattr(tdist, "is_initialized", lambda: rank is not None)
        monkeypatch.setattr(tdist, "get_rank", lambda group=None: rank)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="avion_ds.data.datasets.video_clips"):
            assert len(build_dataset(cfg, "train").missing) == 1  # every rank still drops the row
        return [r.getMessage() for r in caplog.records if "annotation rows usable" in r.getMessage()]

    assert len(summaries(0, "0")) == 1 and len(summaries(None, "0")) == 1
    assert summaries(1, "1") == [] and summaries(None, "3") == []  # process group, or launcher env before it


def test_timeout_skips_a_hung_sample(epic_cfg, tmp_path, monkeypatch, caplog) -> None:
    import avion_ds.data.decode.select as decoders

    (tmp_path / "slow_plugin.py").write_text(
        "import time\nfrom avion_ds.data.decode.select import DecordDecoder, register_backend\n"
        "class Slow(DecordDecoder):\n    name = 'slow'\n"
        "    def _decode(self, path, indices, crop):\n"
        "        if path.endswith('/0.mp4'):\n            time.sleep(120)\n"
        "        return super()._decode(path, indices, crop)\n"
        "register_backend('slow', Slow)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(decoders.PLUGINS_ENV, "slow_plugin")
    ds = build_dataset(replace(epic_cfg, decoder="slow", decode_timeout_s=1.0), "train")
    first = ds.sample_span(0)[0].chunks[0].path
    bad = [i for i in range(len(ds)) if ds.sample_span(i)[1] < 45 and ds.sample_span(i)[0].chunks[0].path == first]
    with caplog.at_level(logging.WARNING, logger="avion_ds.data.datasets.video_clips"):
        item = ds[bad[0]]
    assert item["skipped"] >= 1 and "timed out after 1s" in caplog.text
    ds.decoder.close()
    decoders.REGISTRY.pop("slow", None)


def test_unavailable_decoder_fails_at_construction(epic_cfg, monkeypatch) -> None:
    import sys

    from avion_ds.data.decode.select import DecoderUnavailable

    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    with pytest.raises(DecoderUnavailable, match="torchcodec"):
        build_dataset(replace(epic_cfg, decoder="torchcodec"), "train")


@pytest.mark.parametrize("decoder", ["torchcodec", "pyav"])
def test_other_backends_in_dataset(decoder, epic_cfg) -> None:
    a = build_dataset(replace(epic_cfg, decoder=decoder), "val")[2]["frames"]
    b = build_dataset(epic_cfg, "val")[2]["frames"]
    assert a.shape == b.shape and (a.float() - b.float()).abs().mean() < 8.0


def test_deferred_errors_travel_in_the_item(epic_copy, epic_raw, tmp_path, caplog) -> None:
    """defer_errors (train/eval loops): skipped samples' messages ride in ``bad`` instead of a worker log
    line; under on_error=raise a placeholder of the right shape carries the message in ``fatal``."""
    import torch

    root, cfg = epic_copy
    row, reason = _damage("zero_byte", root, epic_raw, tmp_path)
    good = _good_row(epic_raw)
    good["start_timestamp"], good["stop_timestamp"] = "00:00:06.10", "00:00:07.90"
    csv_path = tmp_path / "rows.csv"
    _write_rows(csv_path, [row, good])
    cfg = replace(cfg, train_csv=str(csv_path), val_csv="")
    ds = build_dataset(cfg, "train")
    ds.defer_errors = True
    with caplog.at_level(logging.WARNING, logger="avion_ds.data.datasets.video_clips"):
        item = ds[0]
    assert not caplog.records and item["fatal"] == "" and item["skipped"] >= 1
    assert reason in item["bad"] and len(item["bad"].splitlines()) == item["skipped"]

    strict = build_dataset(replace(cfg, on_error="raise"), "train")
    strict.defer_errors = True
    placeholder, real = strict[0], strict[1]
    assert reason in placeholder["fatal"] and real["fatal"] == ""
    assert placeholder["frames"].shape == real["frames"].shape and placeholder["frames"].dtype == torch.uint8
    assert set(placeholder["label"]) == {"verb", "noun"}

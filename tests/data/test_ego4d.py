"""Ego4D narration clips: AVION's frame ids (barcodes), seeded jitter, narration draws, file formats, bad rows."""

from __future__ import annotations

import csv
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.config import ConfigError, DataConfig, Recipe
from avion_ds.data import build_dataset
from avion_ds.data.crop import CropBox, clip_rng
from avion_ds.data.datasets.build import read_annotations
from avion_ds.data.datasets.ego4d import TEXT_STREAM, Ego4dDataset, Ego4dKeys
from avion_ds.data.datasets.epic_mir import EpicMirKeys
from avion_ds.data.datasets.quarantine import row_key
from avion_ds.data.datasets.registry import dataset_config
from avion_ds.data.errors import DataError
from avion_ds.data.prep.synthetic import read_frame_index
from avion_ds.data.tokenizer import tokenize
from avion_ds.engine import preflight

# index_chunks: video "idx", 150 frames at 30 fps, 96x72, chunks of 1 s (30 frames) named by start second
ROWS = [
    ("idx", np.float64(0.5), np.float64(3.2), "#C C cuts the onion"),  # spans 3 chunks
    ("idx", 1.0, 1.1, "c picks a knife"),  # shorter than num_frames: repeated frames
    ("idx", np.float32(4.0), 5.3, ["c rinses a cup", "c washes the cup", "c cleans a mug"]),  # past the end
    ("idx", 2, 4, "c opens the tap", np.int64(3)),  # extra fields are ignored (AVION reads [:4])
]


def avion_get_frame_ids(start_frame, end_frame, num_segments=32, jitter=True, rand=np.random.rand):
    """AVION's avion/data/clip_dataset.py get_frame_ids (MIT), its np.random.rand passed in."""
    frame_ids = np.convolve(np.linspace(start_frame, end_frame, num_segments + 1), [0.5, 0.5], mode="valid")
    if jitter:
        seg_size = float(end_frame - start_frame - 1) / num_segments
        shift = (rand(num_segments) - 0.5) * seg_size
        frame_ids += shift
    return frame_ids.astype(int).tolist()


def avion_frame_ids(second, end_second, clip_length, jitter, rand, chunk_len=1, fps=30, chunk_frames=30, chunks=5):
    """AVION's chunked video_loader frame ids (chunks ``chunk_len`` s of ``chunk_frames`` decodable frames)."""
    chunk_end = int(end_second) // chunk_len * chunk_len
    while chunk_end // chunk_len >= chunks:  # `not osp.exists(video_filename)`
        chunk_end -= chunk_len
    end_second = min(end_second, (chunk_frames - 1) / fps + chunk_end)
    return avion_get_frame_ids(
        int(np.round(second * fps)), int(np.round(end_second * fps)), num_segments=clip_length, jitter=jitter, rand=rand
    )


def write_rows(path: Path, rows: list[tuple]) -> Path:
    """``rows`` as AVION's pickle, a CSV or JSON lines, by ``path``'s suffix."""
    if path.suffix == ".pkl":
        path.write_bytes(pickle.dumps(list(rows)))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["video_uid", "start_sec", "end_sec", "narration"])
            w.writerows([r[0], float(r[1]), float(r[2]), r[3]] for r in rows)
    else:
        lines = [
            json.dumps({"video_uid": r[0], "start_sec": float(r[1]), "end_sec": float(r[2]), "narration": r[3]})
            for r in rows
        ]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def ego_cfg(index_chunks, tmp_path) -> DataConfig:
    pkl = write_rows(tmp_path / "ego4d_train.pkl", ROWS)
    return DataConfig(
        dataset="ego4d",
        root=str(index_chunks),
        train_csv=str(pkl),
        val_csv=str(pkl),
        num_frames=4,
        size=48,
        decoder="pyav",
        decode_timeout_s=0.0,
        on_error="raise",
    )


def whole_frames(ds: Ego4dDataset) -> Ego4dDataset:
    """Crops off (the whole 96x72 frame resized): the barcodes stay readable."""
    ds.crop_boxes = lambda h, w, rng: [CropBox(0, 0, h, w)]
    return ds


def frame_ids(ds: Ego4dDataset, i: int) -> list[int]:
    return [read_frame_index(f) for f in ds[i]["frames"].numpy()]


def test_eval_frames_are_avions_midpoints_without_jitter(ego_cfg) -> None:
    ds = whole_frames(build_dataset(ego_cfg, "val"))
    assert isinstance(ds, Ego4dDataset) and len(ds) == 4
    for i, (_, s, e, *_) in enumerate(ROWS):
        want = avion_frame_ids(float(s), float(e), 4, jitter=False, rand=None)
        assert frame_ids(ds, i) == want, i
        ds.set_epoch(3)
        assert frame_ids(ds, i) == want, i  # no jitter at eval, whatever the epoch


def test_train_jitter_is_avions_seeded_and_within_half_a_segment(ego_cfg) -> None:
    ds = whole_frames(build_dataset(ego_cfg, "train", seed=5))
    again = whole_frames(build_dataset(ego_cfg, "train", seed=5))
    i, (_, s, e, _) = 0, ROWS[0]
    start, end = round(float(s) * 30), round(float(e) * 30)
    half = (end - start - 1) / 4 / 2
    mids = avion_get_frame_ids(start, end, 4, jitter=False)
    seen = set()
    for epoch in range(4):
        ds.set_epoch(epoch)
        again.set_epoch(epoch)
        got = frame_ids(ds, i)
        rng = clip_rng(5, epoch, i, 0)  # the clip's generator: its first draws are the temporal jitter
        assert got == avion_frame_ids(float(s), float(e), 4, jitter=True, rand=rng.random)
        assert got == frame_ids(again, i)  # same (seed, epoch, index): same clip
        assert all(abs(g - m) <= half + 1 for g, m in zip(got, mids, strict=True))
        seen.add(tuple(got))
    assert len(seen) > 1  # a new epoch moves the frames


def test_fps_key_sets_the_frame_rate(ego_cfg) -> None:
    ds = build_dataset(replace(ego_cfg, fps=15.0), "val")
    _, start, end, _ = ds.sample_span(0)
    assert (start, end) == (round(0.5 * 15), round(3.2 * 15))
    _, start, end, _ = build_dataset(ego_cfg, "val").sample_span(0)
    assert (start, end) == (15, 96)  # the video's own 30 fps


def test_rephraser_lists_draw_a_seeded_narration_per_epoch(ego_cfg) -> None:
    ds = build_dataset(ego_cfg, "train", seed=2)
    options = ROWS[2][3]
    drawn = []
    for epoch in range(8):
        ds.set_epoch(epoch)
        text = ds.sample_span(2)[3]
        want = options[int(clip_rng(2, epoch, 2, TEXT_STREAM).integers(3))]
        assert text == want and ds.sample_span(2)[3] == text
        drawn.append(text)
    assert len(set(drawn)) > 1
    ds.set_epoch(5)
    item = ds[2]
    assert torch.equal(item["label"]["tokens"], tokenize(options[int(clip_rng(2, 5, 2, TEXT_STREAM).integers(3))])[0])
    assert item["label"]["tokens"].shape == (77,) and item["label"]["tokens"].dtype == torch.long
    val = build_dataset(ego_cfg, "val", seed=2)
    texts = set()
    for epoch in range(4):
        val.set_epoch(epoch)
        texts.add(val.sample_span(2)[3])
    assert len(texts) == 1  # eval: one narration for every epoch


def test_item_layout(ego_cfg) -> None:
    item = build_dataset(ego_cfg, "train")[0]
    assert item["frames"].dtype == torch.uint8 and item["frames"].shape == (4, 48, 48, 3)
    assert torch.equal(item["label"]["tokens"], tokenize(ROWS[0][3])[0])
    assert item["index"] == 0 and item["skipped"] == 0 and item["failed_index"] == -1


def test_pickle_csv_jsonl_give_the_same_rows(ego_cfg, tmp_path) -> None:
    spans = []
    rows = [r[:4] for r in ROWS[:2]] + [("idx", 2.0, 4.0, "c opens the tap")]
    for suffix in (".pkl", ".csv", ".jsonl"):
        path = write_rows(tmp_path / f"rows{suffix}", rows)
        ds = build_dataset(replace(ego_cfg, val_csv=str(path)), "val")
        spans.append([(e.video_id, s, t, text) for e, s, t, text in map(ds.sample_span, range(len(ds)))])
        first = 2 if suffix == ".csv" else 1  # CSV rows are named by line (the header is line 1)
        assert [ds.row_where(i) for i in range(len(ds))] == [(path, first + n) for n in range(3)]
    assert spans[0] == spans[1] == spans[2]
    lists = write_rows(tmp_path / "lists.jsonl", [ROWS[2]])
    assert build_dataset(replace(ego_cfg, val_csv=str(lists)), "val").sample_span(0)[3] in ROWS[2][3]


def test_aux_files_are_appended_to_train_only(ego_cfg, tmp_path) -> None:
    aux1 = write_rows(tmp_path / "narrator.pkl", [("idx", 0.0, 1.0, ["n1", "n2"]), ("idx", 1.0, 2.0, "n3")])
    aux2 = write_rows(tmp_path / "more.csv", [("idx", 3.0, 4.0, "n4")])
    cfg = dataset_config("ego4d", **vars(ego_cfg), aux_train=[str(aux1), str(aux2)])  # the section's key
    ds = build_dataset(cfg, "train")
    assert len(ds) == len(ROWS) + 3
    assert [ds.row_where(i) for i in range(len(ROWS), len(ds))] == [(aux1, 1), (aux1, 2), (aux2, 2)]
    assert ds.sample_span(len(ds) - 1)[3] == "n4" and ds.sample_span(0)[3] == ROWS[0][3]
    assert len(build_dataset(cfg, "val")) == len(ROWS)
    assert read_annotations(cfg, "train") == (len(ROWS) + 3, {}) and read_annotations(cfg, "val") == (len(ROWS), {})


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("idx", 3.0, 2.0, "x")], ":1 (idx): end_sec 2 is before start_sec 3"),
        ([("idx", -2.0, -1.0, "x")], ":1 (idx): start_sec/end_sec -2/-1: a time before the video's start"),
        ([("idx", -0.5, 2.0, "x")], ":1 (idx): start_sec/end_sec -0.5/2: a time before the video's start"),
        ([("idx", "soon", 2.0, "x")], ":1 (idx): start_sec/end_sec 'soon'/2.0 are not numbers"),
        ([("idx", 1.0, 2.0, "  ")], ":1 (idx): empty narration"),
        ([("idx", 1.0, 2.0, [])], ":1 (idx): narration must be a non-empty string or list of strings"),
        ([("idx", 1.0, 2.0, None)], ":1 (idx): narration must be a non-empty string or list of strings, got None"),
    ],
)
def test_bad_row_values_are_bad_samples_named_in_one_line(ego_cfg, tmp_path, rows, message) -> None:
    path = write_rows(tmp_path / "bad.pkl", [*rows, ROWS[0]])
    ds = build_dataset(replace(ego_cfg, train_csv=str(path)), "train")
    with pytest.raises(DataError) as err:
        ds[0]
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{path}:1") and message in str(err.value)
    skip = build_dataset(replace(ego_cfg, train_csv=str(path), on_error="skip"), "train")
    item = skip[0]
    assert item["skipped"] >= 1 and item["index"] == 1 and skip.errors >= 1


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("short.pkl", pickle.dumps([("idx", 0.0, 1.0, "x"), ("idx", 0.0, 1.0)]), ":2: expected a tuple (video_uid"),
        ("dict.pkl", pickle.dumps({"a": 1}), ": expected a list of (video_uid, start_sec, end_sec, narration"),
        (
            "keys.jsonl",
            b'{"video_uid": "idx", "start_sec": 0, "end_sec": 1, "narration": "x"}\n{"video_uid": "idx"}\n',
            ":2: missing key(s) start_sec, end_sec, narration",
        ),
        (
            "broken.jsonl",
            b'{"video_uid": "idx", "start_sec": 0, "end_sec": 1, "narration": "x"}\n{oops\n',
            ":2: not a JSON object",
        ),
        ("cols.csv", b"video_uid,start_sec,narration\nidx,0,x\n", ": missing column(s) end_sec"),
        ("latin.csv", b"video_uid,start_sec,end_sec,narration\nidx,0,1,caf\xe9\n", ": not UTF-8 text (byte 0xe9"),
        ("latin.jsonl", b'{"video_uid": "idx", "start_sec": 0, "end_sec": 1, "narration": "caf\xe9"}\n', ": not UTF-8"),
        ("empty.csv", b"video_uid,start_sec,end_sec,narration\n", ": no narration rows"),
        ("cut.pkl", pickle.dumps(ROWS[:2])[:-9], ": not a readable pickle"),
        ("code.pkl", b"cos\nsystem\n(S'true'\ntR.", ": refused to unpickle global os.system"),
    ],
)
def test_malformed_files_fail_at_construction_in_one_line(ego_cfg, tmp_path, name, content, message) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        build_dataset(replace(ego_cfg, train_csv=str(path)), "train")
    assert "\n" not in str(err.value) and str(err.value).startswith(str(path)) and message in str(err.value)
    with pytest.raises(
        ValueError, match="no narration rows|:2|missing column|not a readable|refused|expected a list|not UTF-8"
    ):
        read_annotations(replace(ego_cfg, train_csv=str(path)), "train")


def test_missing_videos_and_quarantine_drop_rows_up_front(ego_cfg, tmp_path) -> None:
    path = write_rows(tmp_path / "rows.pkl", [("nope", 0.0, 1.0, "x"), *[r[:4] for r in ROWS]])
    quarantine = tmp_path / "q.tsv"
    quarantine.write_text(f"{row_key(path, 2)}\tbad row\n")
    cfg = replace(ego_cfg, train_csv=str(path), quarantine=str(quarantine))
    ds = build_dataset(cfg, "train")
    # row 1: missing video; row 2 (ROWS[0]) named by quarantine.tsv
    assert [ds.row_where(i)[1] for i in range(len(ds))] == [3, 4, 5]
    assert len(ds.missing) == 1 and "rows.pkl:1 (nope): video 'nope' not found" in ds.missing[0]
    assert len(ds.quarantined) == 1 and "bad row" in ds.quarantined[0]
    quarantine.write_text("idx/4.mp4\tbad chunk\n")
    ds = build_dataset(cfg, "train")  # row 4 (ROWS[2], 4.0-5.3 s) reads chunk 4; the others do not
    assert [ds.row_where(i)[1] for i in range(len(ds))] == [2, 3, 5]
    assert len(ds.quarantined) == 1 and "rows.pkl:4 (idx): idx/4.mp4: bad chunk" in ds.quarantined[0]


def test_whole_videos_resolve_by_uid(ego_cfg, index_video) -> None:
    ds = build_dataset(replace(ego_cfg, root=str(index_video.parent), chunked=False), "val")
    entry, start, end, _ = ds.sample_span(0)
    assert entry.video_id == "idx" and (start, end) == (15, 96)


def test_preflight_checks_the_extra_paths(ego_cfg, tmp_path) -> None:
    recipe = Recipe(data=ego_cfg)
    preflight.check_data_paths(recipe)
    assert preflight.check_data_layout(recipe) == {"train": len(ROWS), "val": len(ROWS)}
    mir_val = replace(ego_cfg, val_dataset="epic_mir")  # the MIR pair is checked for an epic_mir split
    for data, sections, message in (
        (ego_cfg, {"ego4d": Ego4dKeys([ego_cfg.train_csv, str(tmp_path / "gone.pkl")])}, "ego4d.aux_train[1]: file"),
        (replace(ego_cfg, val_root=str(tmp_path / "nowhere")), {}, "data.val_root: dir not found"),
        (mir_val, {"epic_mir": EpicMirKeys(val_sentences="s.csv")}, "epic_mir.val_relevancy is empty but its pair"),
        (
            mir_val,
            {"epic_mir": EpicMirKeys(val_sentences=ego_cfg.train_csv, val_relevancy=str(tmp_path / "r.pkl"))},
            "epic_mir.val_relevancy: file not found",
        ),
    ):
        recipe = Recipe(data=data)
        recipe.sections.update(sections)
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            preflight.check_data_paths(recipe)
    empty = tmp_path / "empty_root"
    empty.mkdir()
    with pytest.raises(ConfigError, match="data.val_root=.* has no manifest.jsonl"):
        preflight.check_data_layout(Recipe(data=replace(ego_cfg, val_root=str(empty))))


def test_check_reads_the_aux_files_of_the_recipe(ego_cfg, tmp_path) -> None:
    """`avion-ds check` builds the splits with the recipe's sections: ego4d.aux_train's rows are checked too."""
    from avion_ds.data.prep.check import CheckReport, check_rows

    aux = write_rows(tmp_path / "aux.csv", [("idx", 3.0, 4.0, "n4")])
    plain, with_aux = CheckReport(ego_cfg.root, "sampled"), CheckReport(ego_cfg.root, "sampled")
    check_rows(ego_cfg, plain)
    check_rows(ego_cfg, with_aux, {"ego4d": Ego4dKeys([str(aux)])})
    assert with_aux.rows["train"] == plain.rows["train"] + 1 and with_aux.rows["val"] == plain.rows["val"]

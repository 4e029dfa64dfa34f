"""EPIC-100 MIR: AVION's frame ids over the segment, row ids, relevancy-drawn captions, AVION's MIR indexing."""

from __future__ import annotations

import csv
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.data import build_dataset
from avion_ds.data.crop import CropBox, clip_rng
from avion_ds.data.datasets.build import read_annotations
from avion_ds.data.datasets.epic_mir import CAPTION_STREAM, EpicMirDataset, load_mir_targets
from avion_ds.data.datasets.registry import dataset_config
from avion_ds.data.errors import DataError
from avion_ds.data.prep.synthetic import read_frame_index
from avion_ds.data.safe_pickle import UnsafePickle
from avion_ds.data.tokenizer import tokenize

COLUMNS = (
    "narration_id,participant_id,video_id,narration_timestamp,start_timestamp,stop_timestamp,start_frame,"
    "stop_frame,narration,verb,verb_class,noun,noun_class,all_nouns,all_noun_classes"
)
# (narration_id, video_id, start, stop, narration) over index_chunks' video "idx" (150 frames, 30 fps, 1 s chunks)
SEGMENTS = [
    ("idx_0", "idx", "00:00:00.50", "00:00:03.20", "cut onion"),
    ("idx_1", "idx", "00:00:01.00", "00:00:01.10", "pick up knife"),
    ("nope_0", "nope", "00:00:00.00", "00:00:01.00", "no video"),  # dropped up front; later rows keep their row
    ("idx_2", "idx", "00:00:04.00", "00:00:05.30", "rinse cup"),
    ("idx_3", "idx", "00:00:02.00", "00:00:04.00", "open tap"),
]
SENTENCES = [("idx_3", "open tap"), ("idx_0", "cut onion"), ("idx_1", "pick up knife")]
RELEVANCY = np.array(
    [[0.0, 1.0, 0.5], [0.1, 0.2, 1.0], [0.0, 0.0, 0.0], [0.1, 0.05, 0.1], [1.0, 0.0, 0.3]]
)  # rows x sentences; row 3 has no value > 0.1


def avion_get_frame_ids(start_frame, end_frame, num_segments=32, jitter=True, rand=np.random.rand):
    """AVION's avion/data/clip_dataset.py get_frame_ids (MIT), its np.random.rand passed in."""
    frame_ids = np.convolve(np.linspace(start_frame, end_frame, num_segments + 1), [0.5, 0.5], mode="valid")
    if jitter:
        seg_size = float(end_frame - start_frame - 1) / num_segments
        shift = (rand(num_segments) - 0.5) * seg_size
        frame_ids += shift
    return frame_ids.astype(int).tolist()


def avion_mir_frame_ids(start_ts, stop_ts, clip_length, jitter, rand=None, fps=30, chunk_frames=30, chunks=5):
    """AVION's ek100_mir path: datetime2sec, then the chunked video_loader (chunk_len 1 s here)."""

    def datetime2sec(text):
        hh, mm, ss = text.split(":")
        return int(hh) * 3600 + int(mm) * 60 + float(ss)

    second, end_second = datetime2sec(start_ts), datetime2sec(stop_ts)
    chunk_end = int(end_second)
    while chunk_end >= chunks:  # `not osp.exists(video_filename)`
        chunk_end -= 1
    end_second = min(end_second, (chunk_frames - 1) / fps + chunk_end)
    return avion_get_frame_ids(
        int(np.round(second * fps)), int(np.round(end_second * fps)), num_segments=clip_length, jitter=jitter, rand=rand
    )


def avion_indexes(csv_path: Path, sentence_path: Path) -> list[int]:
    """validate_mir: ``[video_id.tolist().index(elem) for elem in text_id]`` on the first CSV columns."""
    with csv_path.open() as f:
        video_id = [row[0] for row in csv.reader(f)][1:]
    with sentence_path.open() as f:
        text_id = [row[0] for row in csv.reader(f)][1:]
    return [video_id.index(elem) for elem in text_id]


@pytest.fixture()
def mir(index_chunks, tmp_path) -> dict:
    csv_path = tmp_path / "EPIC_100_retrieval_test.csv"
    lines = [COLUMNS] + [
        f"{nid},{vid[:3]},{vid},{a},{a},{b},0,0,{text},v,0,n,0,['n'],[0]" for nid, vid, a, b, text in SEGMENTS
    ]
    csv_path.write_text("\n".join(lines) + "\n")
    sentences = tmp_path / "EPIC_100_retrieval_test_sentence.csv"
    sentences.write_text("narration_id,narration\n" + "".join(f"{a},{b}\n" for a, b in SENTENCES))
    relevancy = tmp_path / "caption_relevancy_EPIC_100_retrieval_test.pkl"
    relevancy.write_bytes(pickle.dumps(RELEVANCY))
    cfg = dataset_config(
        "epic_mir",
        root=str(index_chunks),
        train_csv=str(csv_path),
        val_csv=str(csv_path),
        num_frames=4,
        size=48,
        decoder="pyav",
        decode_timeout_s=0.0,
        on_error="raise",
    )
    return {"cfg": cfg, "csv": csv_path, "sentences": sentences, "relevancy": relevancy}


def whole_frames(ds: EpicMirDataset) -> EpicMirDataset:
    """Crops off (the whole 96x72 frame resized): the barcodes stay readable."""
    ds.crop_boxes = lambda h, w, rng: [CropBox(0, 0, h, w)]
    return ds


def test_eval_items_frames_tokens_rows(mir) -> None:
    ds = whole_frames(build_dataset(mir["cfg"], "val"))
    assert isinstance(ds, EpicMirDataset) and len(ds) == 4 and len(ds.missing) == 1
    kept = [s for s in SEGMENTS if s[1] == "idx"]
    rows = [0, 1, 3, 4]
    for i, (seg, row) in enumerate(zip(kept, rows, strict=True)):
        item = ds[i]
        want = avion_mir_frame_ids(seg[2], seg[3], 4, jitter=False)
        assert [read_frame_index(f) for f in item["frames"].numpy()] == want, seg
        assert torch.equal(item["label"]["tokens"], tokenize(seg[4])[0])
        assert item["label"]["row"] == row and item["label"]["relevancy"] == 1.0


def test_train_jitter_is_avions_and_seeded(mir) -> None:
    ds = whole_frames(build_dataset(mir["cfg"], "train", seed=4))
    seen = set()
    for epoch in range(3):
        ds.set_epoch(epoch)
        got = [read_frame_index(f) for f in ds[0]["frames"].numpy()]
        assert got == avion_mir_frame_ids(SEGMENTS[0][2], SEGMENTS[0][3], 4, True, clip_rng(4, epoch, 0, 0).random)
        seen.add(tuple(got))
    assert len(seen) > 1


def test_mir_targets_follow_avions_indexing(mir, tmp_path) -> None:
    t = load_mir_targets(mir["csv"], mir["sentences"], mir["relevancy"])
    assert t.columns.tolist() == avion_indexes(mir["csv"], mir["sentences"]) == [4, 0, 1]
    assert t.relevancy.dtype == np.float64 and np.array_equal(t.relevancy, RELEVANCY)
    assert t.sentences == [b for _, b in SENTENCES] and t.sentence_ids == [a for a, _ in SENTENCES]
    dup, dup_sentences = tmp_path / "dup.csv", tmp_path / "dup_sentence.csv"  # a repeated id: its first row
    dup.write_text("narration_id,video_id\na,v\nb,v\na,v\nc,v\n")
    dup_sentences.write_text("narration_id,narration\nc,x\na,y\n")
    rel = tmp_path / "dup.pkl"
    rel.write_bytes(pickle.dumps(np.ones((4, 2))))
    assert load_mir_targets(dup, dup_sentences, rel).columns.tolist() == avion_indexes(dup, dup_sentences) == [3, 0]
    f32 = tmp_path / "f32.pkl"
    f32.write_bytes(pickle.dumps(RELEVANCY.astype(np.float32)))
    assert load_mir_targets(mir["csv"], mir["sentences"], f32).relevancy.dtype == np.float32


def test_mir_targets_refuse_mismatches_in_one_line(mir, tmp_path) -> None:
    narrow = tmp_path / "narrow.pkl"
    narrow.write_bytes(pickle.dumps(RELEVANCY[:, :2]))
    with pytest.raises(ValueError) as err:
        load_mir_targets(mir["csv"], mir["sentences"], narrow)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(narrow)) and "(5, 2)" in msg and "expected (5, 3)" in msg
    assert str(mir["csv"]) in msg and str(mir["sentences"]) in msg
    stray = tmp_path / "stray_sentence.csv"
    stray.write_text("narration_id,narration\nidx_0,cut onion\nP99_01_7,ghost\n")
    with pytest.raises(ValueError, match=r"stray_sentence.csv: sentence row 2 \(P99_01_7\) names no row of"):
        load_mir_targets(mir["csv"], stray, mir["relevancy"])
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(UnsafePickle, match="refused to unpickle global os.system"):
        load_mir_targets(mir["csv"], mir["sentences"], evil)


def test_training_draws_a_relevant_caption(mir) -> None:
    cfg = replace(mir["cfg"], train_sentences=str(mir["sentences"]), train_relevancy=str(mir["relevancy"]))
    ds = build_dataset(cfg, "train", seed=1)
    drawn = set()
    for epoch in range(8):
        ds.set_epoch(epoch)
        item = ds[0]  # CSV row 0: sentences 1 (1.0) and 2 (0.5) are positives; sentence 0 (0.0) is not
        positives = np.where(RELEVANCY[0] > 0.1)[0]
        j = int(positives[int(clip_rng(1, epoch, 0, CAPTION_STREAM).integers(len(positives)))])
        assert torch.equal(item["label"]["tokens"], tokenize(SENTENCES[j][1])[0])
        assert item["label"]["relevancy"] == RELEVANCY[0, j] and item["label"]["row"] == 0
        drawn.add(j)
    assert drawn == {1, 2}
    ds.set_epoch(0)
    assert ds.caption(1) == ("pick up knife", 1.0)  # row 1: only sentence 2 is above 0.1 (0.1 itself is not)
    with pytest.raises(DataError, match=r"EPIC_100_retrieval_test.csv:5 \(idx_2\): no sentence has relevancy > 0.1"):
        ds[2]  # CSV row 3
    with pytest.raises(ValueError, match="epic_mir.train_relevancy is empty"):
        build_dataset(replace(mir["cfg"], train_sentences=str(mir["sentences"])), "train")


def test_val_split_of_another_dataset_reads_val_root(mir, tmp_path) -> None:
    ego = tmp_path / "ego4d_train.pkl"
    ego.write_bytes(pickle.dumps([("somewhere", 0.0, 1.0, "x")]))
    cfg = replace(
        mir["cfg"],
        dataset="ego4d",
        val_dataset="epic_mir",
        root=str(tmp_path / "ego4d_chunks"),  # not read by the val split
        val_root=mir["cfg"].root,
        train_csv=str(ego),
    )
    ds = build_dataset(cfg, "val")
    assert isinstance(ds, EpicMirDataset) and ds.index.root == Path(mir["cfg"].root) and len(ds) == 4
    assert read_annotations(cfg, "val") == (5, {}) and read_annotations(cfg, "train") == (1, {})


def test_bad_timestamps_are_bad_samples_in_training_and_refused_for_evaluation(mir, tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{COLUMNS}\nidx_9,idx,idx,x,00:00:03.00,00:00:01.00,0,0,backwards,v,0,n,0,[],[]\n")
    ds = build_dataset(replace(mir["cfg"], train_csv=str(bad)), "train")
    with pytest.raises(DataError, match=r"bad.csv:2 \(idx_9\): stop_timestamp 00:00:01.00 is before start_timestamp"):
        ds[0]
    with pytest.raises(ValueError, match=r"bad.csv:2 \(idx_9\): stop_timestamp 00:00:01.00 is before start_timestamp"):
        build_dataset(replace(mir["cfg"], val_csv=str(bad)), "val")  # at start-up, not after training

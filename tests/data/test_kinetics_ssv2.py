"""Kinetics official CSVs / class lists / VideoMAE lists and SSv2 json splits: labels, lookup, missing videos."""

from __future__ import annotations

import csv as csv_mod
import json
import logging

import pytest

from avion_ds.config import DataConfig
from avion_ds.data import build_dataset
from avion_ds.data.datasets.build import read_annotations
from avion_ds.data.datasets.kinetics import kinetics_stem
from avion_ds.data.datasets.ssv2 import template_class
from avion_ds.data.prep.chunking import chunk_videos
from avion_ds.data.prep.synthetic import write_video

K400_ROWS = [  # label, youtube_id, time_start, time_end, split; "zumba" clip is missing on disk
    ("air drumming", "aaa", 14, 24, "train"),
    ("abseiling", "bbb", 0, 10, "train"),
    ("zumba", "ccc", 30, 40, "train"),
    ("abseiling", "ddd", 5, 15, "train"),
    ("air drumming", "eee", 1, 11, "train"),
]


@pytest.fixture(scope="module")
def k400(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("k400")
    videos = root / "videos"
    for label, yt, a, b, _ in K400_ROWS:
        if yt == "ccc":
            continue
        name = f"{kinetics_stem(yt, a, b)}.mp4" if yt != "eee" else "eee.mp4"  # one copy names files by id only
        folder = videos / label if yt != "ddd" else videos  # class folders, and one flat file
        write_video(folder / name, 12, 32, 32, fps=10)
    csv = root / "train.csv"
    with csv.open("w", newline="") as f:  # the official files quote names with spaces
        w = csv_mod.writer(f)
        w.writerow(["label", "youtube_id", "time_start", "time_end", "split"])
        w.writerows(K400_ROWS)
    chunks = root / "chunks"
    assert not chunk_videos(videos, chunks, chunk_seconds=1.0, fps=10, progress=False).failed
    return {"root": root, "videos": videos, "csv": csv, "chunks": chunks}


def test_kinetics_stem() -> None:
    assert kinetics_stem("abc-_12", "14.0", 24) == "abc-_12_000014_000024"


@pytest.mark.parametrize("chunked", [True, False])
def test_official_csv_sorted_classes_and_missing(k400, chunked, caplog) -> None:
    root = k400["chunks"] if chunked else k400["videos"]
    cfg = DataConfig(
        dataset="kinetics",
        root=str(root),
        chunked=chunked,
        train_csv=str(k400["csv"]),
        val_csv=str(k400["csv"]),
        num_frames=4,
        sampling="stride",
        stride=2,
        size=32,
        decode_timeout_s=0.0,
        on_error="raise",
    )
    with caplog.at_level(logging.WARNING):
        ds = build_dataset(cfg, "train")
    assert ds.classes == ["abseiling", "air drumming", "zumba"] and ds.num_classes == 3
    assert len(ds) == 4 and len(ds.missing) == 1 and "ccc_000030_000040" in ds.missing[0]
    assert any("4 of 5 annotation rows usable; 1 missing videos" in r.getMessage() for r in caplog.records)
    labels = {ds.row_name(i): ds[i]["label"] for i in range(len(ds))}
    assert labels == {"aaa_000014_000024": 1, "bbb_000000_000010": 0, "ddd_000005_000015": 0, "eee": 1}
    assert ds[0]["frames"].shape == (4, 32, 32, 3)


def test_class_list_file_and_unknown_label(k400, tmp_path) -> None:
    classes = tmp_path / "classes.txt"
    classes.write_text("zumba\nair drumming\nabseiling\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(k400["chunks"]),
        train_csv=str(k400["csv"]),
        val_csv="",
        class_list=str(classes),
        decode_timeout_s=0.0,
    )
    ds = build_dataset(cfg, "train")
    assert ds.num_classes == 3 and {ds.row_name(i): ds.rows[i][3] for i in range(len(ds))}["aaa_000014_000024"] == 1
    classes.write_text("zumba\nabseiling\n")
    with pytest.raises(ValueError, match=r"train.csv:2: label 'air drumming' is not a known class"):
        build_dataset(cfg, "train")
    with pytest.raises(ValueError, match=r"train.csv:2: label 'air drumming' is not a known class"):
        read_annotations(cfg, "train")  # the start-up check (before any process group) says the same
    val = tmp_path / "val.csv"  # names from the sorted train labels: a val-only class is refused at start-up
    val.write_text("label,youtube_id,time_start,time_end,split\nabseiling,bbb,0,10,val\nyoga,fff,0,10,val\n")
    named = DataConfig(dataset="kinetics", root=str(k400["chunks"]), train_csv=str(k400["csv"]), val_csv=str(val))
    with pytest.raises(ValueError, match=r"val.csv:3: label 'yoga' is not a known class \(the sorted train labels\)"):
        read_annotations(named, "val")
    with pytest.raises(ValueError, match=r"val.csv:3: label 'yoga' is not a known class"):
        build_dataset(named, "val")
    test_csv = tmp_path / "test.csv"  # the official test split has no labels
    test_csv.write_text("youtube_id,time_start,time_end,split\naaa,14,24,test\n")
    with pytest.raises(ValueError, match="official Kinetics CSV without a label column"):
        build_dataset(DataConfig(dataset="kinetics", root=str(k400["chunks"]), train_csv=str(test_csv)), "train")
    lst = tmp_path / "ints.txt"  # integer labels with a class list: taken as indices
    lst.write_text("abseiling/bbb_000000_000010.mp4 2\n")
    classes.write_text("zumba\nair drumming\nabseiling\n")
    ds = build_dataset(
        DataConfig(
            dataset="kinetics",
            root=str(k400["chunks"]),
            train_csv=str(lst),
            class_list=str(classes),
            decode_timeout_s=0.0,
        ),
        "train",
    )
    assert ds.rows[0][3] == 2 and ds.num_classes == 3


def test_videomae_path_label_list_with_a_missing_video(k400, tmp_path) -> None:
    lst = tmp_path / "train.txt"
    lst.write_text("abseiling/bbb_000000_000010.mp4 0\nnope/missing.mp4 2\nddd_000005_000015.mp4 0\n")
    for root, chunked in ((k400["videos"], False), (k400["chunks"], True)):
        cfg = DataConfig(
            dataset="kinetics",
            root=str(root),
            chunked=chunked,
            train_csv=str(lst),
            val_csv="",
            decode_timeout_s=0.0,
            num_frames=2,
            size=32,
            on_error="raise",
        )
        ds = build_dataset(cfg, "train")
        assert len(ds) == 2 and len(ds.missing) == 1 and ds.num_classes == 3
        assert [ds[i]["label"] for i in range(2)] == [0, 0]


LABELS = {
    "Pushing something from left to right": "0",
    "Pushing something from right to left": "1",
    "Putting number of something onto something": "2",
}


@pytest.fixture(scope="module")
def ssv2(tmp_path_factory, transcode) -> dict:
    root = tmp_path_factory.mktemp("ssv2")
    mp4 = write_video(root / "tmp.mp4", 20, 32, 32, fps=12)
    for vid in ("101", "102", "103"):
        transcode(mp4, root / "videos" / f"{vid}.webm", "libvpx-vp9" if vid != "102" else "libvpx", "webm")
    (root / "labels.json").write_text(json.dumps(LABELS))
    train = [
        {
            "id": "101",
            "label": "pushing a cup from left to right",
            "template": "Pushing [something] from left to right",
            "placeholders": ["a cup"],
        },
        {
            "id": "102",
            "label": "putting 2 pens onto a book",
            "template": "Putting [number of] [something] onto [something]",
            "placeholders": ["2", "pens", "a book"],
        },
        {"id": "999", "label": "missing", "template": "Pushing [something] from right to left", "placeholders": ["x"]},
    ]
    (root / "train.json").write_text(json.dumps(train))
    (root / "validation.json").write_text(json.dumps([dict(train[0], id="103")]))
    assert not chunk_videos(root / "videos", root / "chunks", chunk_seconds=1.0, fps=12, progress=False).failed
    return root


def test_ssv2_templates_to_classes_and_missing(ssv2) -> None:
    assert (
        template_class("Putting [number of] [something] onto [something]")
        == "Putting number of something onto something"
    )
    cfg = DataConfig(
        dataset="ssv2",
        root=str(ssv2 / "chunks"),
        train_csv=str(ssv2 / "train.json"),
        val_csv=str(ssv2 / "validation.json"),
        num_frames=4,
        size=32,
        decode_timeout_s=0.0,
        on_error="raise",
    )
    ds = build_dataset(cfg, "train")
    assert ds.num_classes == 3 and len(ds) == 2 and len(ds.missing) == 1 and "999" in ds.missing[0]
    assert [ds[i]["label"] for i in range(2)] == [0, 2]
    assert build_dataset(cfg, "val", temporal_views=2, spatial_views=3)[0]["frames"].shape == (6, 4, 32, 32, 3)


def test_ssv2_bad_inputs_name_the_culprit(ssv2, tmp_path) -> None:
    cfg = DataConfig(
        dataset="ssv2", root=str(ssv2 / "chunks"), train_csv=str(ssv2 / "train.json"), val_csv="", decode_timeout_s=0.0
    )
    bad = tmp_path / "train.json"
    bad.write_text(json.dumps([{"id": "101", "template": "Spinning [something]"}]))
    with pytest.raises(FileNotFoundError, match="labels file not found"):
        build_dataset(DataConfig(**{**cfg.__dict__, "train_csv": str(bad)}), "train")
    with pytest.raises(
        ValueError, match=r"entry 1 \(id 101\): template 'Spinning \[something\]' is not in labels.json"
    ):
        build_dataset(
            DataConfig(**{**cfg.__dict__, "train_csv": str(bad), "class_list": str(ssv2 / "labels.json")}), "train"
        )
    bad.write_text(json.dumps([{"id": "101"}]))
    with pytest.raises(ValueError, match="entry 1 has no id/template"):
        build_dataset(
            DataConfig(**{**cfg.__dict__, "train_csv": str(bad), "class_list": str(ssv2 / "labels.json")}), "train"
        )


def test_class_index_beyond_the_class_list_is_refused_at_start_up(k400, tmp_path) -> None:
    """An integer label with a class list must index it; the dataset would otherwise serve label 7 of 2."""
    classes = tmp_path / "classes.txt"
    classes.write_text("abseiling\nair drumming\n")
    val = tmp_path / "val.csv"
    val.write_text("label,youtube_id,time_start,time_end,split\n1,bbb,0,10,val\n7,aaa,14,24,val\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(k400["chunks"]),
        train_csv=str(k400["csv"]),
        val_csv=str(val),
        class_list=str(classes),
    )
    with pytest.raises(ValueError, match=r"val.csv:3: label '7' is not a known class"):
        read_annotations(cfg, "val")


def test_ssv2_from_shards_gives_the_chunk_tree_clips(ssv2, tmp_path) -> None:
    """SSv2's json splits pack with their template classes; the shards give the chunk tree's clips and labels
    (the missing video's row is left out of the shards as it is of the tree's dataset)."""
    pytest.importorskip("litdata")
    from avion_ds.cli.pack import main
    from avion_ds.tasks import load_recipe
    from tests.helpers.recipes import write_recipe
    from tests.helpers.shard_checks import assert_shards_give_tree_clips

    data = {"root": ssv2 / "chunks", "train_csv": ssv2 / "train.json", "val_csv": ssv2 / "validation.json"}
    keys = {"dataset": "ssv2", "class_list": str(ssv2 / "labels.json"), "decode_timeout_s": 0.0}
    recipe_path = write_recipe(tmp_path / "s.yaml", data, tmp_path / "run", data=keys, model={"heads": None})
    out = tmp_path / "shards"
    assert main([str(data["root"]), str(out), "--config", str(recipe_path)]) == 0
    sizes = assert_shards_give_tree_clips(out, load_recipe(recipe_path, []))
    assert sizes == {"train": 2, "val": 1}  # the missing video's row is left out of both

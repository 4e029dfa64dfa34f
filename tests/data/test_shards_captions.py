"""Video-text datasets from litdata shards (``data.shards``): ``ego4d`` (narrations, one of a row's phrasings
drawn per epoch) and ``epic_mir`` (captions drawn by relevancy) give the chunk tree's clips AND caption tokens
for the same (seed, epoch, sample), epoch after epoch; MIR scoring reads its relevancy matrix from the
annotation files; contrastive training runs from the shards; shards packed for another dataset are one line."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("litdata")
pytest.importorskip("open_clip")

SEED = 3
PHRASINGS = ("{}", "{} slowly", "{} with care")  # each Ego4D row's list of rephrasings (one drawn per epoch)


def _recipes(tmp: Path, info: dict, root: Path, ego: Path) -> dict[str, Path]:
    """A contrastive recipe (ego4d train, epic_mir val scored by relevancy) and a MIR one (captions drawn by
    relevancy in training), both over the chunk tree ``root`` (the bad-input table's tiny settings)."""
    common = {
        "model": {"name": "clip_vit_test_tiny"},
        "batch": {"global_batch": 4, "micro_batch": 2},
        "schedule": {"epochs": 1, "warmup_epochs": 0},
        "logging": {"log_every": 1, "progress": False},
        "checkpoint": {"keep_last": 1},
        "precision": "fp32",
        "seed": SEED,
    }
    data = {"num_frames": 2, "size": 32, "fps": 0.0, "decoder": "decord", "root": str(root), "workers": 0}
    data |= {"decode_timeout_s": 0.0, "val_csv": str(info["mir_test_csv"])}
    val = {"val_sentences": str(info["mir_test_sentences"]), "val_relevancy": str(info["mir_test_relevancy"])}
    train = {"train_sentences": str(info["mir_train_sentences"]), "train_relevancy": str(info["mir_train_relevancy"])}
    recipes = {
        "contrastive": {
            "task": "contrastive",
            "data": data | {"dataset": "ego4d", "val_dataset": "epic_mir", "train_csv": str(ego)},
            "epic_mir": val,
            **common,
        },
        "mir": {
            "task": "mir",
            "data": data | {"dataset": "epic_mir", "train_csv": str(info["mir_train_csv"])},
            "epic_mir": val | train,
            **common,
        },
    }
    out = {}
    for name, recipe in recipes.items():
        out[name] = tmp / f"{name}.yaml"
        out[name].write_text(yaml.safe_dump(recipe | {"output_dir": str(tmp / f"run_{name}")}))
    return out


@pytest.fixture(scope="module")
def text_tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two tiny synthetic videos chunked (2 s chunks: some clips span two), Ego4D narrations as lists of
    phrasings (one row a plain string), the EPIC-MIR files, both recipes and their shards."""
    from avion_ds.cli.pack import main
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic

    tmp = tmp_path_factory.mktemp("captions")
    info = make_synthetic_epic(
        tmp / "synth", num_videos=2, segments_per_video=8, segment_seconds=1.0, width=64, height=48, fps=8, seed=2,
        val_fraction=0.5,
    )  # fmt: skip
    summary = chunk_videos(info["videos"], tmp / "chunks", chunk_seconds=2.0, short_side=48, fps=8, progress=False)
    assert not summary.failed, summary
    rows = pickle.loads(Path(info["ego4d_train_pkl"]).read_bytes())
    ego = tmp / "ego4d_lists.pkl"
    lists = [(u, s, e, [p.format(n) for p in PHRASINGS]) for u, s, e, n in rows[1:]]
    ego.write_bytes(pickle.dumps([rows[0], *lists]))
    recipes = _recipes(tmp, info, tmp / "chunks", ego)
    shards = {}
    for name, path in recipes.items():
        shards[name] = tmp / f"shards_{name}"
        assert main([str(tmp / "chunks"), str(shards[name]), "--shard-bytes", "30000", "--config", str(path)]) == 0
    return {"tmp": tmp, "recipes": recipes, "shards": shards, "root": tmp / "chunks"}


def _pair(tree: dict, name: str, split: str) -> tuple[Any, Any]:
    """(the shard dataset, the chunk-tree dataset) of ``split`` for recipe ``name``."""
    from avion_ds.data.datasets.build import build_dataset, open_shards
    from avion_ds.tasks import load_recipe

    recipe = load_recipe(tree["recipes"][name], [])
    ref = build_dataset(recipe.data, split, seed=SEED, sections=recipe.sections)
    location = str(tree["shards"][name])
    cfg = replace(recipe.data, root="", train_csv="", shards=location)  # val_csv stays: MIR scoring reads it
    return open_shards(location, cfg, split, seed=SEED, sections=recipe.sections), ref


def _labels_equal(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        torch.equal(torch.as_tensor(got[k]), torch.as_tensor(want[k])) for k in want
    )


@pytest.mark.parametrize(("name", "split"), [("contrastive", "train"), ("mir", "train"), ("contrastive", "val")])
def test_shard_captions_equal_chunk_tree_captions_per_epoch(text_tree: dict, name: str, split: str) -> None:
    """Every row once per epoch with the chunk tree's frames and caption tokens (MIR: and relevancy-matrix row
    and relevancy) for epochs 0 and 1; in training the drawn captions change between the epochs."""
    ds, ref = _pair(text_tree, name, split)
    tokens: dict[int, dict[int, torch.Tensor]] = {}
    for epoch in (0, 1):
        ds.set_clip_epoch(epoch)
        ref.set_epoch(epoch)
        seen = tokens[epoch] = {}
        for item in ds:
            i, want = item["index"], ref[item["index"]]
            assert item["skipped"] == 0, item["failed_reason"]
            assert torch.equal(item["frames"], want["frames"]), (name, split, epoch, i)
            assert _labels_equal(item["label"], want["label"]), (name, split, epoch, i)
            seen[i] = item["label"]["tokens"]
        assert sorted(seen) == list(range(len(ref))), (name, split, epoch)
    changed = sum(not torch.equal(tokens[0][i], tokens[1][i]) for i in tokens[0])
    if split == "train":
        assert changed > 0, "the captions drawn per epoch did not change between epochs"
    else:
        assert changed == 0  # validation captions are the rows' own narrations


def test_epoch_captions_reach_persistent_workers(text_tree: dict) -> None:
    """Through the training loader (2 persistent DataLoader workers) each epoch's batches hold the chunk tree's
    caption tokens of that epoch: the epoch set between epochs reaches the workers' draws."""
    from avion_ds.data.loader import build_loader, set_epoch

    ds, ref = _pair(text_tree, "contrastive", "train")
    loader = build_loader(ds, 2, 2, shuffle=True, seed=SEED, drop_last=True, distributed=False)
    for epoch in (0, 1):
        set_epoch(loader, epoch)
        ref.set_epoch(epoch)
        seen = 0
        for batch in loader:
            for k, i in enumerate(batch["index"].tolist()):
                assert torch.equal(batch["label"]["tokens"][k], ref[i]["label"]["tokens"]), (epoch, i)
                seen += 1
        assert seen == len(ref) // 2 * 2, (epoch, seen)


def test_shard_rows_carry_every_caption_candidate(text_tree: dict) -> None:
    """The packed rows hold the candidates the datasets draw from (JSON in meta, the item layout unchanged):
    Ego4D's phrasing lists, EPIC-MIR's relevant sentences with their relevancy; index.json says what for."""
    from litdata import StreamingDataset

    from avion_ds.data.datasets.epic_mir import positive_numbers
    from avion_ds.data.prep.shard_index import ITEM_FORMAT

    for name, want in (("contrastive", {"train": "narration", "val": "retrieval"}), ("mir", {"train": "retrieval"})):
        location = text_tree["shards"][name]
        index = json.loads((location / "index.json").read_text())
        assert index["config"]["data_format"] == ITEM_FORMAT
        assert {s: v["kind"] for s, v in index["avion_labels"].items() if s in want} == want
        plain = text_tree["tmp"] / f"plain_{name}"
        plain.mkdir(exist_ok=True)
        for f in location.glob("*.bin"):
            (plain / f.name).write_bytes(f.read_bytes())
        index["config"].pop("item_loader")  # read the video items as written
        (plain / "index.json").write_text(json.dumps(index))
        metas = [json.loads(item["meta"]) for item in StreamingDataset(str(plain))]
        labels = [r[2] for m in metas for r in m["rows"]["train"]]
        if name == "contrastive":
            assert any(isinstance(x, list) and len(x) == len(PHRASINGS) for x in labels)
            assert not any("texts" in m for m in metas)
            continue
        for m in metas:  # each sentence a row can draw: named by number, its text once in the item
            named = {j for r in m["rows"]["train"] for j in positive_numbers(r[2])}
            assert named and named == {int(j) for j in m["texts"]["train"]}
        assert all(len(positive_numbers(x)) > 1 for x in labels)  # same verb or noun: relevancy 0.5 or 1
        assert {float(v) for x in labels for v in x["positives"]} <= {0.5, 1.0}


def test_rows_packed_for_another_dataset_are_named() -> None:
    """index.json's avion_labels against the recipe's datasets: rows packed for another dataset are one line
    naming both; shards without the record pass for fixed labels and are refused for drawn captions."""
    from avion_ds.data.prep.pack import labels_problem

    ego = {"train": {"dataset": "ego4d", "kind": "narration"}, "val": {"dataset": "epic_mir", "kind": "retrieval"}}
    epic = {s: {"dataset": "epic", "kind": "class"} for s in ("train", "val")}
    assert labels_problem({"avion_labels": ego}, ego, "i.json") is None
    assert labels_problem({}, epic, "i.json") is None
    line = labels_problem({"avion_labels": ego}, epic, "i.json")
    assert line is not None and "train rows packed for data.dataset='ego4d', not for data.dataset='epic'" in line
    line = labels_problem({}, ego, "i.json")
    assert line is not None and "packed without a dataset name" in line and "narration captions" in line
    line = labels_problem({"avion_labels": {**ego, "val": epic["val"]}}, ego, "i.json")
    assert line is not None and "val rows packed for data.dataset='epic'" in line and "retrieval captions" in line


def test_mir_scoring_from_shards_reads_the_relevancy_files(text_tree: dict) -> None:
    """The val split from shards carries the MIR targets read from data.val_csv and the epic_mir.val_* pair (the
    whole relevancy matrix is not in the shards); without data.val_csv it is one line naming the keys."""
    from avion_ds.data.datasets.build import open_shards
    from avion_ds.data.errors import KeyedInputError
    from avion_ds.tasks import load_recipe

    ds, ref = _pair(text_tree, "mir", "val")
    assert ds.mir_targets is not None and np.array_equal(ds.mir_targets.relevancy, ref.mir_targets.relevancy)
    assert ds.mir_targets.row_ids == ref.mir_targets.row_ids
    recipe = load_recipe(text_tree["recipes"]["mir"], [])
    cfg = replace(recipe.data, root="", train_csv="", val_csv="")
    with pytest.raises(KeyedInputError, match="epic_mir.val_relevancy: MIR scoring with data.shards"):
        open_shards(str(text_tree["shards"]["mir"]), cfg, "val", seed=SEED, sections=recipe.sections)


def test_contrastive_training_from_shards(text_tree: dict, tmp_path: Path) -> None:
    """`avion-ds train` of the contrastive recipe with data.shards (no chunk tree, no narration file): an epoch of
    two steps with finite losses, then MIR scoring of the val rows from the shards (mAP, as from the tree)."""
    from tests.helpers.launch import launch
    from tests.helpers.recipes import losses

    recipe = yaml.safe_load(text_tree["recipes"]["contrastive"].read_text())
    recipe["data"] |= {"shards": str(text_tree["shards"]["contrastive"]), "root": "", "train_csv": ""}
    recipe["schedule"] |= {"steps_per_epoch": 2}
    recipe["eval"] = {"every_epochs": 1, "batch_size": 4}
    recipe["output_dir"] = str(tmp_path / "run")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    done = launch(["--config", path], nprocs=1, launcher="python")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = losses(tmp_path / "run")
    assert sorted(got) == [1, 2] and all(np.isfinite(v) for v in got.values())
    history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    scores = [row["eval"] for row in history if "eval" in row]
    assert len(scores) == 1 and 0 < scores[0]["avg_map"] <= 1  # MIR scoring: the relevancy files' matrix

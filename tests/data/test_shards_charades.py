"""Charades-Ego (multi-label, LaViLa's float frame count per video) from litdata shards: ``avion-ds pack`` carries
each row's class indices and frame count exactly through the JSON rows, and the shards give the chunk tree's
clips, multi-hot labels and past-the-end flags; zero-shot evaluation from the shards scores as from the tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("litdata")

FRAMES, FPS = 40, 8  # every video: 5 s
LENGTHS = {"AAAAEGO": "5.00", "BBBBEGO": "4.90", "CCCCEGO": "5.30"}  # CCCC's frame ids reach past its end
ACTIONS = {"AAAAEGO": "c001 0.00 2.00;c000 1.00 3.00", "BBBBEGO": "", "CCCCEGO": "c002 0.00 1.00"}
KEYS = ["data.dataset=charades_ego", "data.num_frames=16", "data.size=32", "data.decode_timeout_s=0"]


@pytest.fixture(scope="module")
def charades_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three tiny videos chunked into a tree (2.5 s chunks), Charades-Ego's class file and test CSV over them, and
    the tree packed with a charades_ego recipe (train and val rows: the same CSV)."""
    from avion_ds.cli.pack import main
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import write_video

    tmp = tmp_path_factory.mktemp("charades_shards")
    (tmp / "videos").mkdir()
    for vid in LENGTHS:
        write_video(tmp / "videos" / f"{vid}.mp4", FRAMES, 64, 48, fps=FPS)
    classes = tmp / "Charades_v1_classes.txt"
    classes.write_text("c000 Holding some clothes\nc001 Opening a door\nc002 Eating\n")
    csv = tmp / "CharadesEgo_v1_test_only1st.csv"
    head = "id,subject,scene,quality,relevance,verified,script,objects,descriptions,actions,length\n"
    csv.write_text(head + "".join(f'{v},S1,Hall,6,7,Yes,x,a,d,"{ACTIONS[v]}",{n}\n' for v, n in LENGTHS.items()))
    done = chunk_videos(tmp / "videos", tmp / "chunks", chunk_seconds=2.5, short_side=48, fps=FPS, progress=False)
    assert not done.failed, done
    sets = [*KEYS, f"data.train_csv={csv}", f"data.val_csv={csv}"]
    out = tmp / "shards"
    assert main([str(tmp / "chunks"), str(out), *[x for s in sets for x in ("--set", s)]]) == 0
    return {"tmp": tmp, "chunks": tmp / "chunks", "csv": csv, "classes": classes, "shards": out, "sets": sets}


def test_charades_ego_from_shards_equals_the_chunk_tree(charades_shards: dict) -> None:
    """Every row from the shards: the tree's frames, multi-hot label and past-the-end flag (train epoch 1 and
    val), the packed rows holding class indices and LaViLa's float frame count as the tree computes them."""
    import json

    from avion_ds.tasks import load_recipe
    from tests.helpers.shard_checks import assert_shards_give_tree_clips

    c = charades_shards
    recipe = load_recipe(None, [*c["sets"], f"data.root={c['chunks']}", "data.chunked=true"])
    assert assert_shards_give_tree_clips(c["shards"], recipe) == {"train": 3, "val": 3}

    from avion_ds.data.datasets.build import build_dataset, open_shards

    tree = build_dataset(recipe.data, "val", seed=3, sections=recipe.sections)
    labels = {tree.rows[i][1]["id"]: tree[i] for i in range(len(tree))}
    assert labels["AAAAEGO"]["label"].tolist() == [1.0, 1.0, 0.0] and labels["BBBBEGO"]["label"].sum() == 0
    assert [labels[v]["past_end"] for v in LENGTHS] == [0, 0, 1]  # 8 fps x 5.3 s: a frame id past frame 39
    index = json.loads((c["shards"] / "index.json").read_text())
    assert {s["kind"] for s in index["avion_labels"].values()} == {"class"}
    ds = open_shards(str(c["shards"]), recipe.data, "val", seed=3, sections=recipe.sections)
    packed = {}
    for _ in ds:  # each item's rows, as packed (the JSON read back)
        packed.update({i: row[2] for i, row in ds.clips._item[1].items()})
    assert sorted(packed) == [0, 1, 2]
    for i, label in packed.items():
        assert label == {"classes": tree.rows[i][2], "frames": tree._span(i)[1]}, (i, label)


def test_charades_ego_zero_shot_eval_from_shards(charades_shards: dict, tmp_path: Path) -> None:
    """`avion-ds eval --set task=zeroshot` over the shards (no chunk tree, no annotation CSV: the class file
    only) gives the chunk tree's mAP, rows and classes without positives."""
    from tests.data.test_egocentric import _zero_shot_eval

    c = charades_shards
    common = [*KEYS, "data.num_frames=4", "data.val_dataset=charades_ego", "zeroshot.templates=plain"]
    tree = [*common, f"data.root={c['chunks']}", "data.chunked=true", f"data.val_csv={c['csv']}"]
    shards = [*common, f"data.shards={c['shards']}", "data.root=", "data.val_csv=", f"data.class_list={c['classes']}"]
    want = _zero_shot_eval(tmp_path / "tree", tree)
    got = _zero_shot_eval(tmp_path / "shards", shards)
    assert got["rows"] == want["rows"] == 3 and got["metrics"] == want["metrics"]
    assert got["classes_without_positives"] == want["classes_without_positives"] == 0
    assert set(got["metrics"]) == {"map"}

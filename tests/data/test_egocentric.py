"""EGTEA Gaze+ and Charades-Ego as LaViLa's eval_zeroshot.py reads them (files in their released layouts, tiny
generated videos): labels, LaViLa's clip sampling (EGTEA's zero padding, Charades' sparse midpoints) and the
zero-shot evaluation through `avion-ds eval --set task=zeroshot` (metric names, templates, class counts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from avion_ds.config import DataConfig
from avion_ds.data.datasets.build import build_dataset
from avion_ds.data.datasets.egocentric import lavila_frame_ids, lavila_stride_clips
from avion_ds.data.prep.synthetic import write_video
from tests.engine.test_zero_shot import save_tiny_weights

CLIPS = {  # frames each
    "OP01-R01-PastaSalad-10-20-F1-F2": 20,
    "OP01-R01-PastaSalad-30-40-F3-F4": 60,
    "OP01-R01-PastaSalad-50-60-F5-F6": 36,
}


@pytest.fixture(scope="module")
def egtea(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("egtea")
    for clip, frames in CLIPS.items():
        (root / "cropped_clips" / "OP01-R01-PastaSalad").mkdir(parents=True, exist_ok=True)
        write_video(root / "cropped_clips" / "OP01-R01-PastaSalad" / f"{clip}.mp4", frames, 48, 32, fps=12)
    (root / "action_idx.txt").write_text("Open_fridge 1\nTake_bowl 2\nCut_tomato 3\n")
    (root / "test_split1.txt").write_text("\n".join(f"{c} {a} 1 1" for c, a in zip(CLIPS, (3, 1, 2))) + "\n")
    return {"root": root / "cropped_clips", "split": root / "test_split1.txt"}


@pytest.fixture(scope="module")
def charades(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("charades")
    (root / "videos").mkdir()
    for vid in ("AAAAEGO", "BBBBEGO"):
        write_video(root / "videos" / f"{vid}.mp4", 40, 48, 32, fps=8)
    (root / "Charades_v1_classes.txt").write_text("c000 Holding some clothes\nc001 Opening a door\nc002 Eating\n")
    (root / "CharadesEgo_v1_test_only1st.csv").write_text(
        "id,subject,scene,quality,relevance,verified,script,objects,descriptions,actions,length\n"
        'AAAAEGO,S1,Kitchen,6,7,Yes,x,a,d,"c001 0.00 2.00;c000 1.00 3.00",5.00\n'
        "BBBBEGO,S2,Hall,6,7,Yes,x,a,d,,4.90\n"
    )
    return {"root": root / "videos", "csv": root / "CharadesEgo_v1_test_only1st.csv"}


def _cfg(**kw) -> DataConfig:
    return DataConfig(chunked=False, size=32, decoder="pyav", workers=0, **kw)


def test_egtea_labels_and_lavila_clips(egtea: dict) -> None:
    cfg = _cfg(dataset="egtea", root=str(egtea["root"]), val_csv=str(egtea["split"]), num_frames=16, stride=2)
    ds = build_dataset(cfg, "val", temporal_views=3, spatial_views=3)
    assert ds.class_names == ["open fridge", "take bowl", "cut tomato"] and len(ds) == 3
    short, long = ds[0], ds[1]
    assert short["label"] == 2 and long["label"] == 0  # action numbers 3 and 1 (1-based) -> positions
    assert short["frames"].shape == (9, 16, 32, 32, 3)  # 3 clips x 3 crops
    # 20 frames < 16 x 2: read whole, zero-padded to 32, every 2nd -> frames 0..18 then 6 black frames
    ids = lavila_stride_clips(20, 16, 2, 3)[0]
    assert ids[:10] == list(range(0, 20, 2)) and ids[10:] == [-1] * 6
    assert (short["frames"][:, 10:] == 0).all() and (short["frames"][:, :10].float().mean() > 10)
    assert lavila_stride_clips(60, 16, 2, 3)[2] == list(range(28, 60, 2))  # linspace(0, 28, 3) starts
    assert (long["frames"].float().flatten(2).mean(-1) > 10).all()  # no padding


def test_charades_multi_hot_and_sparse_midpoints(charades: dict) -> None:
    cfg = _cfg(dataset="charades_ego", root=str(charades["root"]), val_csv=str(charades["csv"]), num_frames=4)
    ds = build_dataset(cfg, "val")
    first, second = ds[0], ds[1]
    assert torch.equal(first["label"], torch.tensor([1.0, 1.0, 0.0]))
    assert torch.equal(second["label"], torch.zeros(3))  # a video without actions
    assert first["frames"].shape == (4, 32, 32, 3)
    ds[0]
    assert ds.clip_indices(0, 40, None, 0) == lavila_frame_ids(0, 8 * 5.0, 4) == [5, 15, 24, 34]


def _zero_shot_eval(tmp_path: Path, sets: list[str], ranks: int = 1) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "zs.yaml"
    recipe.write_text("task: zeroshot\nmodel: {name: clip_vit_test_tiny}\n")
    weights = save_tiny_weights(tmp_path / "w.safetensors")
    common = ["data.chunked=false", "data.size=32", "data.decoder=pyav", "data.workers=0", "precision=fp32"]
    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "avion_ds.cli", "eval", "--config", recipe, "--checkpoint", weights, "--out", out]
    argv = [*map(str, cmd), *[x for s in [*common, *sets] for x in ("--set", s)]]
    if ranks == 1:
        proc = subprocess.run(argv, capture_output=True, text=True)
    else:
        from tests.helpers import launch

        proc = launch(argv[3:], nprocs=ranks, launcher="torchrun", module="avion_ds.cli")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_egtea_zero_shot_eval(egtea: dict, tmp_path: Path) -> None:
    sets = [f"data.root={egtea['root']}", f"data.val_csv={egtea['split']}", "data.val_dataset=egtea"]
    sets += ["data.num_frames=4", "data.stride=2", "eval.temporal_views=2", "eval.spatial_views=3"]
    result = _zero_shot_eval(tmp_path, sets)
    assert set(result["metrics"]) == {"top1", "top5", "mean_class"}
    assert result["views"] == 6 and result["classes"] == {"egtea": 3} and result["rows"] == 3
    assert result["templates"] == ["#C C {}", "#C {}"] and "LaViLa" in result["protocol"]


@pytest.mark.multiprocess
def test_egtea_zero_shot_same_on_two_ranks(egtea: dict, tmp_path: Path) -> None:
    """3 clips on 2 ranks (the sampler pads one): the metrics of one process."""
    sets = [f"data.root={egtea['root']}", f"data.val_csv={egtea['split']}", "data.val_dataset=egtea"]
    sets += ["data.num_frames=4", "data.stride=2", "eval.temporal_views=2", "eval.batch_size=1"]
    one = _zero_shot_eval(tmp_path / "one", sets)
    two = _zero_shot_eval(tmp_path / "two", sets, ranks=2)
    assert two["rows"] == one["rows"] == 3 and two["metrics"] == one["metrics"]


def test_charades_zero_shot_eval(charades: dict, tmp_path: Path) -> None:
    sets = [f"data.root={charades['root']}", f"data.val_csv={charades['csv']}", "data.val_dataset=charades_ego"]
    result = _zero_shot_eval(tmp_path, [*sets, "data.num_frames=4", "zeroshot.templates=plain"])
    assert set(result["metrics"]) == {"map"} and result["templates"] == ["{}"]
    assert result["classes_without_positives"] == 1  # c002 is nowhere: averaged over the other two
    assert 0 <= result["metrics"]["map"] <= 100

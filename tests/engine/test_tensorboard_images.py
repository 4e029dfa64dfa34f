"""What TensorBoard shows of a run besides scalars: the resolved recipe (text) and the hyperparameters (HPARAMS)
at start, the task's pictures at each evaluation (pretraining: the reconstruction grid; classification: a
confusion matrix per head), read back from the event files with tensorboard's EventAccumulator; and
`avion-ds reconstruct`'s PNG naming its rows on a left margin."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from avion_ds.distributed.run_log import RunLogger, hparam_values
from avion_ds.tasks.common.evaluation import confusion_images
from avion_ds.tasks.common.pictures import confusion_image, label_margin, label_rows
from avion_ds.tasks.pretrain.reconstruct import ROWS
from tests.helpers import QUICK_DATA, REPO, launch, write_recipe
from tests.helpers.launch import JOBS_SCRIPT

HF_AUTO = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def _events(tb: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    return acc


def _picture(acc, tag: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(acc.Images(tag)[-1].encoded_image_string)).convert("RGB"))


def _hparams(acc) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    values = {
        k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
        for k, v in start.session_start_info.hparams.items()
    }
    return {"values": values, "metrics": [m.name.tag for m in experiment.metric_infos]}


def test_logger_writes_recipe_hparams_and_pictures(tmp_path: Path) -> None:
    log = RunLogger(tmp_path, True, tensorboard=True, progress=False)
    recipe = {"model": {"name": "vit_test_tiny", "heads": {"verb": 4}}, "optim": {"lr": 1e-3, "betas": [0.9, 0.95]}}
    log.run_start(0, recipe, {**recipe, "deepspeed": {"zero_stage": 2}}, ["train/loss", "eval/top1"])
    picture = np.zeros((40, 60, 3), np.uint8)
    picture[:, 30:] = 255
    log.images(5, {"eval/confusion": picture})
    log.close()
    acc = _events(tmp_path / "tb")
    text = acc.Tensors("run/recipe/text_summary")[0].tensor_proto.string_val[0].decode()
    assert yaml.safe_load("\n".join(line[4:] for line in text.splitlines())) == recipe
    hp = _hparams(acc)
    assert hp["values"]["model.name"] == "vit_test_tiny" and hp["values"]["optim.lr"] == pytest.approx(1e-3)
    assert hp["values"]["deepspeed.zero_stage"] == 2 and hp["values"]["model.heads.verb"] == 4
    assert json.loads(hp["values"]["optim.betas"]) == [0.9, 0.95]
    assert hp["metrics"] == ["train/loss", "eval/top1"]
    assert np.array_equal(_picture(acc, "eval/confusion"), picture) and acc.Images("eval/confusion")[0].step == 5


def test_hparam_values_take_only_what_tensorboard_takes() -> None:
    flat = hparam_values({"a": {"b": None, "c": [1, 2], "d": True}, "e": "x", "f": 2.5})
    assert flat == {"a.b": "none", "a.c": "[1, 2]", "a.d": True, "e": "x", "f": 2.5}


def test_confusion_matrix_picture() -> None:
    labels = np.array([0, 0, 0, 0, 1, 1, 2])
    preds = np.array([0, 0, 0, 1, 1, 1, 0])
    img = confusion_image(labels, preds, 3)
    cell = img.shape[0] // 3
    assert img.shape == (3 * cell, 3 * cell, 3) and img.dtype == np.uint8 and img.shape[0] >= 256
    at = img[cell // 2 :: cell, cell // 2 :: cell, 0].astype(int)  # one pixel per cell, red channel
    assert at[1, 1] == at[2, 0] < at[0, 0] < at[0, 1] < at[0, 2] == at[1, 0] == 255  # row-normalised shares
    rows = [{"verb_label": int(a), "verb_pred": int(b), "noun_label": 0, "noun_pred": 0} for a, b in zip(labels, preds)]
    pictures = confusion_images(rows, {"verb": 3, "noun": 2})
    assert set(pictures) == {"eval/confusion_verb", "eval/confusion_noun"}
    assert np.array_equal(pictures["eval/confusion_verb"], img)
    big = confusion_image(np.arange(300) % 300, np.arange(300) % 300, 300, max_classes=128)
    assert big.shape[0] == 128 * -(-256 // 128)  # the 128 most frequent classes shown


def test_row_labels_on_a_left_margin() -> None:
    grid = np.full((3 * 64, 200, 3), 90, np.uint8)
    out = label_rows(grid, ROWS)
    margin = label_margin(ROWS)
    assert out.shape == (3 * 64, 200 + margin, 3) and np.array_equal(out[:, margin:], grid)
    for r in range(3):  # each row's band of the margin has dark text on white
        band = out[r * 64 : (r + 1) * 64, :margin]
        assert (band < 100).any() and (band == 255).mean() > 0.5


def test_reconstruct_png_names_its_rows(tiny_epic: dict, tmp_path: Path) -> None:
    """`avion-ds reconstruct` on weights of a fresh pretraining model: the PNG is the 3 x 3 grid (32 px frames
    upscaled 4x) plus the label margin, and the margin holds text."""
    from safetensors.torch import save_file

    from avion_ds.cli.reconstruct import main
    from avion_ds.tasks import load_recipe
    from avion_ds.tasks.pretrain.task import build_pretrain_model

    recipe = _pretrain_recipe(tmp_path, tiny_epic)
    model = build_pretrain_model(load_recipe(recipe), "")
    weights = tmp_path / "mae.safetensors"
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(weights))
    video = next((Path(tiny_epic["train_csv"]).parent / "videos").glob("*.mp4"))
    out = tmp_path / "grid.png"
    argv = ["--checkpoint", str(weights), "--config", str(recipe), "--video", str(video), "--out", str(out)]
    assert main([*argv, "--frames", "3"]) == 0
    img = np.asarray(Image.open(out).convert("RGB"))
    margin = label_margin(ROWS)
    assert img.shape == (3 * 32 * 4, 3 * 32 * 4 + margin, 3)
    for r in range(3):
        band = img[r * 128 : (r + 1) * 128, :margin]
        assert (band < 100).any(), f"row {r}: no label text in the margin"


def _pretrain_recipe(tmp: Path, data: dict, **extra: object) -> Path:
    recipe = {
        "task": "pretrain",
        "model": {"name": "pretrain_videomae_test_tiny"},
        "data": {"root": str(data["root"]), "num_frames": 4, "size": 32, "workers": 0, "stride": 2}
        | {"decoder": "decord", **QUICK_DATA},
        "videos": {"clips_per_video": 2},
        "pretrain": {"mask_ratio": 0.5, "decoder_mask_type": "running_cell", "decoder_mask_ratio": 0.5},
        "optim": {"lr": 1e-3, "base_batch": 4},
        "schedule": {"epochs": 1, "warmup_epochs": 0.5, "steps_per_epoch": 2},
        "batch": {"global_batch": 4, "micro_batch": 2},
        "eval": {"every_epochs": 1, "batch_size": 2},
        "checkpoint": {"every_steps": 0},
        "logging": {"tensorboard": True, "log_every": 1, "progress": False},
        "output_dir": str(tmp / "pretrain_run"),
        "precision": "fp32",
        **extra,
    }
    path = tmp / "pretrain.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def runs(tiny_epic_quick: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two 2-step runs on 2 CPU ranks in one launcher process: EPIC fine-tuning (ZeRO-2), then pretraining
    under ZeRO-3 (the grid's forward on every rank) from a JSON with Hugging Face's "auto" ZeRO sizes,
    launched with DeepSpeed's ``--deepspeed --deepspeed_config`` pair."""
    tmp = tmp_path_factory.mktemp("tb_pictures")
    ft = write_recipe(
        tmp / "ft.yaml",
        tiny_epic_quick,
        tmp / "ft_run",
        data=QUICK_DATA,
        schedule={"epochs": 1, "steps_per_epoch": 2},
        checkpoint={"every_steps": 0},
    )
    pt = _pretrain_recipe(tmp, tiny_epic_quick)
    zero3 = json.loads((REPO / "ds_configs" / "zero3.json").read_text())  # with Hugging Face's "auto" sizes
    zero3["zero_optimization"].update(dict.fromkeys(HF_AUTO, "auto"))
    (tmp / "zero3_hf_auto.json").write_text(json.dumps(zero3))
    jobs = [
        ["--config", str(ft), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json")],
        ["--config", str(pt), "--deepspeed", "--deepspeed_config", str(tmp / "zero3_hf_auto.json")],
    ]
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    proc = launch([tmp / "jobs.json"], nprocs=2, script_path=JOBS_SCRIPT, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return {"finetune": tmp / "ft_run" / "tb", "pretrain": tmp / "pretrain_run" / "tb", "log": proc.stdout}


@pytest.mark.multiprocess
def test_finetune_run_logs_recipe_hparams_and_confusion(runs: dict) -> None:
    acc = _events(runs["finetune"])
    assert "run/recipe/text_summary" in acc.Tags()["tensors"]
    hp = _hparams(acc)
    assert hp["values"]["model.name"] == "vit_test_tiny" and hp["values"]["deepspeed.zero_stage"] == 2
    assert hp["values"]["deepspeed.world_size"] == 2 and hp["values"]["batch.global_batch"] == 8
    for head, classes in (("verb", 4), ("noun", 3)):
        img = _picture(acc, f"eval/confusion_{head}")
        assert img.shape[0] == img.shape[1] >= 256 and img.shape[0] % classes == 0, (head, img.shape)
        assert (img < 255).any(), head  # some clip was counted


@pytest.mark.multiprocess
def test_pretrain_run_logs_the_reconstruction_grid(runs: dict) -> None:
    acc = _events(runs["pretrain"])
    assert "eval/reconstruction" in acc.Tags()["images"]
    img = _picture(acc, "eval/reconstruction")
    margin = label_margin(ROWS)
    assert img.shape == (3 * 32 * 4, 4 * 32 * 4 + margin, 3)  # 3 rows x 4 frames of 32 px, upscaled 4x
    masked = img[128:256, margin:]
    assert (masked == 128).all(axis=-1).mean() > 0.2  # hidden tokens are grey in the masked row
    assert "run/recipe/text_summary" in acc.Tags()["tensors"] and _hparams(acc)["values"]["task"] == "pretrain"


@pytest.mark.multiprocess
def test_hf_auto_sizes_named_in_the_start_up_summary(runs: dict) -> None:
    """The ZeRO-3 run's JSON had Hugging Face's three "auto" sizes: the start-up lines name what they became."""
    line = next(x for x in runs["log"].splitlines() if x.startswith('deepspeed config "auto" from the hidden size'))
    assert "64 of pretrain_videomae_test_tiny" in line
    assert "reduce_bucket_size=4096 stage3_prefetch_bucket_size=3686 stage3_param_persistence_threshold=640" in line

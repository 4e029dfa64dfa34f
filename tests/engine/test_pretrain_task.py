"""`task: pretrain` through the real engine on 2 CPU ranks: a 2-step smoke run for ZeRO 0/1/2/3 x
activation checkpointing off/on, a ZeRO-2 run interrupted and resumed in a new process that
reproduces the uninterrupted fp32 trajectory bit for bit, and the pretrain -> fine-tune handoff.

All jobs of the first launch run in one launcher process (tests/helpers/train_jobs.py),
so the suite pays the launcher and op loading once; the resume runs in a second launch (a new
process: nothing but the checkpoint carries over). Clips are decoded in-process
(``data.decode_timeout_s: 0``): a decode helper process per dataset and job cost more than training.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.helpers import REPO, losses
from tests.helpers.launch import launch_jobs

pytestmark = pytest.mark.multiprocess


def _recipe(tmp: Path, data: dict) -> Path:
    recipe = {
        "task": "pretrain",
        "model": {"name": "pretrain_videomae_test_tiny"},
        "data": {
            "root": str(data["root"]),
            "num_frames": 4,
            "size": 32,
            "workers": 0,
            "stride": 2,
            "decoder": "decord",
            "decode_timeout_s": 0.0,
        },  # decode in-process: a helper process per dataset costs ~10 s per job
        "videos": {"clips_per_video": 4},
        "pretrain": {"mask_ratio": 0.5, "decoder_mask_type": "running_cell", "decoder_mask_ratio": 0.5},
        "optim": {"lr": 1e-3, "base_batch": 4, "clip_grad": 1.0},
        "schedule": {"epochs": 2, "warmup_epochs": 0.5},
        "batch": {"global_batch": 4, "micro_batch": 2},
        "eval": {"every_epochs": 1, "batch_size": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 3},
        "logging": {"tensorboard": False, "log_every": 1, "progress": False},
        "seed": 5,
        "precision": "fp32",
    }
    path = tmp / "pretrain.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _job(recipe: Path, run: Path, stage: int, *sets: str, exit_after: int | None = None) -> list[str]:
    argv = [
        "--config",
        str(recipe),
        "--deepspeed_config",
        str(REPO / "ds_configs" / f"zero{stage}.json"),
        "--set",
        f"output_dir={run}",
    ]
    for s in sets:
        argv += ["--set", s]
    return argv + (["--exit-after-steps", str(exit_after)] if exit_after else [])


@pytest.fixture(scope="module")
def runs(tiny_epic: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("pretrain")
    recipe = _recipe(tmp, tiny_epic)
    smoke = ["schedule.epochs=1", "schedule.steps_per_epoch=2", "checkpoint.every_steps=0"]
    # the resume pair first: a ZeRO-3 job replaces torch.nn.functional.linear in its process for good
    # (zero.Init's memory-efficient linear), which the resumed run's fresh process would not share
    jobs = [_job(recipe, tmp / "ref", 2), _job(recipe, tmp / "cut", 2, exit_after=2)]
    matrix = {}
    for stage in (0, 1, 2, 3):
        for ac in (False, True):
            run = tmp / f"z{stage}_{'ac' if ac else 'plain'}"
            matrix[(stage, ac)] = run
            jobs.append(_job(recipe, run, stage, *smoke, f"model.activation_checkpointing={str(ac).lower()}"))
    log = "".join(launch_jobs(jobs, tmp / "first.json"))
    (resumed,) = launch_jobs([_job(recipe, tmp / "cut", 2)], tmp / "resume.json")
    return {"matrix": matrix, "ref": tmp / "ref", "cut": tmp / "cut", "log": log, "resumed": resumed}


def test_smoke_over_zero_stages_and_checkpointing(runs: dict) -> None:
    first = None
    for (stage, ac), run in runs["matrix"].items():
        got = losses(run)
        assert sorted(got) == [1, 2] and all(math.isfinite(v) for v in got.values()), (stage, ac, got)
        first = first or got
        for step in (1, 2):  # fp32: every stage and checkpointing setting computes the same losses
            assert abs(got[step] - first[step]) <= 1e-5 * abs(first[step]), (stage, ac, got, first)
        metrics = json.loads((run / "metrics.json").read_text())
        assert 0 < metrics["recon_loss"] and 0.9 < metrics["zero_baseline"] < 1.01
    assert "pretrain pretrain_videomae_test_tiny | world 2 | ZeRO-3" in runs["log"]
    assert "activation checkpointing torch" in runs["log"]


def test_zero2_resume_is_bit_exact(runs: dict) -> None:
    ref, cut = losses(runs["ref"]), losses(runs["cut"])
    assert "resumed from step_00000002" in runs["resumed"], runs["resumed"][-3000:]
    assert sorted(ref) == sorted(cut) == list(range(1, 7))
    assert cut == ref  # fp32, same process count: bit-exact
    a = json.loads((runs["ref"] / "metrics.json").read_text())
    b = json.loads((runs["cut"] / "metrics.json").read_text())
    assert a == b


def test_pretrain_to_finetune_handoff(runs: dict) -> None:
    from avion_ds.engine.export import consolidate
    from avion_ds.models import create_model

    ft = create_model("vit_test_tiny", pretrained=str(runs["ref"]), num_classes=7)
    mae = create_model("pretrain_videomae_test_tiny", pretrained=str(runs["ref"]))
    sd = consolidate(runs["ref"])
    trained = {k.removeprefix("encoder."): v for k, v in sd.items() if k.startswith("encoder.")}
    # the token norm stays behind and fc_norm starts fresh, as in VideoMAE's fine-tuning
    assert {trained.pop("fc_norm.weight").numel(), trained.pop("fc_norm.bias").numel()} == {64}
    assert torch.equal(ft.fc_norm.weight, torch.ones(64)) and torch.equal(ft.fc_norm.bias, torch.zeros(64))
    assert trained and set(trained) <= set(ft.state_dict())
    for k, v in trained.items():
        assert torch.equal(ft.state_dict()[k].reshape(v.shape), v), k
    x = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        mae.encoder.fc_norm.weight.fill_(1.0)
        mae.encoder.fc_norm.bias.zero_()
        torch.testing.assert_close(ft.eval().forward_features(x), mae.encoder.eval().forward_features(x))


def test_reconstruct_writes_the_grid(runs: dict, tiny_epic: dict, tmp_path: Path) -> None:
    from PIL import Image

    from avion_ds.cli.reconstruct import main

    video = next((Path(tiny_epic["train_csv"]).parent / "videos").glob("*.mp4"))
    out = tmp_path / "grid.png"
    assert main(["--checkpoint", str(runs["ref"]), "--video", str(video), "--out", str(out), "--frames", "3"]) == 0
    from avion_ds.tasks.common.pictures import label_margin
    from avion_ds.tasks.pretrain.reconstruct import ROWS

    img = Image.open(out)
    margin = label_margin(ROWS)  # the row names on the left
    assert img.size == (margin + 3 * 32 * 4, 3 * 32 * 4)  # 3 frames x 3 rows of 32 px, upscaled 4x to >= 128 px
    pixels = np.asarray(img)[:, margin:]
    middle = pixels[128:256]
    assert (middle == 128).all(axis=-1).mean() > 0.3  # hidden tokens are grey in the masked row
    assert main(["--checkpoint", str(runs["ref"]), "--video", str(tmp_path / "missing.mp4"), "--out", str(out)]) == 2


def _local_recipe(tmp: Path, data: dict, *sets: str):
    from avion_ds.tasks import load_recipe

    return load_recipe(_recipe(tmp, data), ["data.workers=0", *sets])


def test_repeated_samples_get_their_own_crops_and_masks(tiny_epic: dict, tmp_path: Path) -> None:
    """VideoMAE V2 --num_sample: one decode, num_sample clips, each with its own crop and masks; the
    device side flattens clips and masks alike, and the model takes the batch."""
    from avion_ds.data import DeviceAugment, build_dataset, build_loader
    from avion_ds.tasks.pretrain.task import PretrainTask, build_pretrain_model

    recipe = _local_recipe(tmp_path, tiny_epic, "data.num_sample=4", "videos.clips_per_video=1")
    ds = build_dataset(recipe.data, "train", seed=recipe.seed, sections=recipe.sections)
    PretrainTask().prepare_datasets(recipe, ds)
    item = ds[0]
    frames, masks = item["frames"], item["label"]
    assert frames.shape == (4, 4, 32, 32, 3)
    assert set(masks) == {"mask", "decode_mask"} and all(m.shape == (4, 8) for m in masks.values())
    assert len({frames[s].numpy().tobytes() for s in range(4)}) > 1  # a crop per sample
    for key in masks:  # encoder and decoder masks drawn per sample
        assert len({masks[key][s].numpy().tobytes() for s in range(4)}) > 1, key
    again = ds[0]  # seeded per sample, as the rest of the loader
    assert torch.equal(again["frames"], frames) and all(torch.equal(again["label"][k], masks[k]) for k in masks)
    batch = next(iter(build_loader(ds, 2, 0, shuffle=False, seed=0, drop_last=True, distributed=False)))
    x, flat = DeviceAugment(recipe.data, 0, train=True)(batch["frames"], batch["label"])
    assert x.shape == (8, 3, 4, 32, 32) and flat["mask"].shape == (8, 8)
    assert torch.equal(flat["mask"][5], batch["label"]["mask"][1, 1])  # clip 5 = video 1, sample 1
    out = build_pretrain_model(recipe)(x, **flat)
    assert math.isfinite(float(out.loss.detach()))


def test_v2_recipe_sets_num_sample_and_valid_batches() -> None:
    from avion_ds.distributed.ds_config import resolve_batch
    from avion_ds.tasks import load_recipe

    r = load_recipe(REPO / "launch" / "recipes" / "pretrain_vit_g_v2.yaml")
    assert (r.data.num_sample, r.videos.clips_per_video) == (4, 1)  # V2: --num_sample 4, each video once
    for world in (8, 16, 64):
        plan = resolve_batch(r, world)
        assert plan.global_batch == 256 and plan.micro_batch * plan.grad_accum * world == 256


def test_pretrain_eval_ignores_sampler_padding(tiny_epic: dict, tmp_path: Path) -> None:
    """5 val clips on 2 ranks: DistributedSampler pads rank 1 with clip 0; the padded pass (both ranks'
    shards run in one process) gives the unpadded pass's numbers."""
    from torch.utils.data import DataLoader, DistributedSampler

    from avion_ds.data import DeviceAugment, build_dataset
    from avion_ds.tasks.base import EvalContext
    from avion_ds.tasks.pretrain.task import PretrainTask, build_pretrain_model, evaluate_pretrain

    recipe = _local_recipe(tmp_path, tiny_epic, "videos.clips_per_video=5")
    ds = build_dataset(recipe.data, "val", seed=recipe.seed, sections=recipe.sections)
    PretrainTask().prepare_datasets(recipe, ds)
    sub = torch.utils.data.Subset(ds, range(5))
    padded = [i for r in range(2) for i in DistributedSampler(sub, num_replicas=2, rank=r, shuffle=False)]
    assert sorted(padded) == [0, 0, 1, 2, 3, 4]
    torch.manual_seed(0)
    model = build_pretrain_model(recipe).eval()
    aug = DeviceAugment(recipe.data, 0, train=False)

    def run(order: list[int], bs: int) -> dict[str, float]:
        loader = DataLoader(sub, batch_size=bs, sampler=order)
        return evaluate_pretrain(EvalContext(model, loader, aug, torch.device("cpu"), recipe))

    plain, pad = run(list(range(5)), 5), run(padded, 3)
    for key in plain:
        assert pad[key] == pytest.approx(plain[key], rel=1e-5), (key, pad, plain)
    assert run(list(range(5)), 2) == pytest.approx(plain, rel=1e-5)  # batching does not change it either

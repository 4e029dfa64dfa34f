"""`task: umt` end to end on one CPU process: `avion-ds train` with launch/recipes/umt_demo_cpu.yaml (its teacher
a tiny dual encoder's weights, the synthetic videos of tests/engine/conftest.py) for 2 optimizer steps and a
validation under ZeRO-0 and ZeRO-3 (the same fp32 losses), then fine-tuning starts from the run directory and
from its `avion-ds export` file with the whole backbone matched. The teacher stays out of the checkpoint, and
what a resume loads leaves it as its file has it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers import REPO, engine_env, losses, run_process
from tests.helpers.recipes import write_recipe

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "avion_ds.cli"]


def _train(data: dict, teacher: Path, run: Path, stage: int) -> str:
    """`avion-ds train` of the demo recipe for 2 steps on one process under ZeRO ``stage``; its log."""
    sets = {
        "data.root": data["root"],
        "data.workers": 0,
        "data.decode_timeout_s": 0,
        "umt.teacher": teacher,
        "output_dir": run,
        "schedule.epochs": 1,
        "schedule.steps_per_epoch": 2,
        "schedule.warmup_epochs": 0,
        "batch.global_batch": 2,
        "batch.micro_batch": 2,
        "optim.base_batch": 2,
        "eval.every_epochs": 1,
        "eval.batch_size": 4,
        "logging.tensorboard": "false",
        "logging.log_every": 1,
    }
    cmd = [*CLI, "train", "--config", REPO / "launch" / "recipes" / "umt_demo_cpu.yaml"]
    cmd += ["--deepspeed_config", REPO / "ds_configs" / f"zero{stage}.json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    proc = run_process(cmd, env=engine_env(), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    return log


@pytest.fixture(scope="module")
def umt_run(tiny_epic: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from avion_ds.models import create_model

    tmp = tmp_path_factory.mktemp("umt")
    torch.manual_seed(0)
    teacher = tmp / "teacher.safetensors"
    save_file({k: v.contiguous() for k, v in create_model("clip_vit_test_tiny").state_dict().items()}, str(teacher))
    runs, log = {}, ""
    for stage in (0, 3):  # ZeRO-3: the student built partitioned, the teacher beside it
        runs[stage] = tmp / f"run_z{stage}"
        log += _train(tiny_epic, teacher, runs[stage], stage)
    return {"tmp": tmp, "run": runs[0], "z3": runs[3], "log": log, "data": tiny_epic}


def test_two_steps_and_a_validation(umt_run: dict) -> None:
    run = umt_run["run"]
    got = losses(run)
    assert sorted(got) == [1, 2] and all(math.isfinite(v) for v in got.values()), got
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    for r in (r for r in rows if r.get("loss") is not None):  # clip_loss_ratio 1: loss = loss_clip
        assert r["loss"] == pytest.approx(r["loss_clip"], rel=1e-6) and 0.0 < r["loss_clip"] < 4.0, r
    metrics = json.loads((run / "metrics.json").read_text())
    assert 0.0 < metrics["umt_loss"] < 4.0 and -1.0 <= metrics["umt_cos"] <= 1.0, metrics
    assert "umt teacher clip_vit_test_tiny: frozen, 16 px frames, blocks [1, 0] -> 16-d" in umt_run["log"]


def test_zero3_computes_the_same_losses(umt_run: dict) -> None:
    """fp32: the partitioned student (its init gathered) and the replicated teacher give ZeRO-0's losses."""
    ref, got = losses(umt_run["run"]), losses(umt_run["z3"])
    assert sorted(got) == sorted(ref) == [1, 2]
    for step in ref:
        assert abs(got[step] - ref[step]) <= 1e-5 * abs(ref[step]), (got, ref)
    assert "| ZeRO-3 |" in umt_run["log"]


def test_the_teacher_stays_out_of_the_checkpoint(umt_run: dict) -> None:
    from avion_ds.storage.run_dir import consolidate

    sd = consolidate(umt_run["run"])
    assert any(k.startswith("clip_decoder.1.") for k in sd), sorted(sd)[:8]
    assert not any("teacher" in k or k.startswith("tower.") for k in sd), sorted(sd)


def test_resuming_loads_the_student_and_leaves_the_teacher_as_its_file(umt_run: dict) -> None:
    """What a resume (and an elastic resume, which reshards the same states) loads into the module is the
    run's student alone: the run's weights load strictly into a freshly built model, and its teacher, rebuilt
    from ``umt.teacher`` at the start, stays the file's video tower."""
    from safetensors.torch import load_file

    from avion_ds.storage.run_dir import consolidate
    from avion_ds.tasks import load_recipe, task_of

    teacher_file = umt_run["tmp"] / "teacher.safetensors"
    sets = [f"umt.teacher={teacher_file}", f"data.root={umt_run['data']['root']}"]
    recipe = load_recipe(REPO / "launch" / "recipes" / "umt_demo_cpu.yaml", sets)
    model = task_of(recipe).build_model(recipe, pretrained="")
    sd = consolidate(umt_run["run"])
    model.load_state_dict(sd, strict=True)
    tower = dict(model.frozen_teacher.tower.state_dict())
    saved = {k.removeprefix("visual."): v for k, v in load_file(str(teacher_file)).items() if k.startswith("visual.")}
    for name, value in tower.items():
        if name != "pos_embed":  # resized to the teacher's 16 px frames
            assert torch.equal(value, saved[name]), name


def _finetune_report(umt_run: dict, source: Path, name: str) -> dict:
    """Build the fine-tuning model of a tiny EPIC recipe (tubelet 1, as the student) from ``source`` as
    `avion-ds train` does, and read its pretrained_report.json."""
    from avion_ds.tasks import load_recipe, task_of

    tmp = umt_run["tmp"]
    out = tmp / f"ft_{name}"
    path = write_recipe(
        tmp / f"ft_{name}.yaml", umt_run["data"], out, model={"tubelet_size": 1, "pretrained": str(source)}
    )
    recipe = load_recipe(path)
    task_of(recipe).build_model(recipe, run_dir=out)
    return json.loads((out / "pretrained_report.json").read_text())


def test_finetuning_starts_from_the_run_and_its_export(umt_run: dict) -> None:
    from avion_ds.engine.export import export

    report = _finetune_report(umt_run, umt_run["run"], "run")
    assert report["backbone_matched_fraction"] == 1.0, report
    assert all(k.startswith("heads.") for k in report["missing"]), report["missing"]  # the classifier: fresh
    assert all(k.startswith("clip_decoder.") for k in report["unexpected"]), report["unexpected"]
    exported = export(umt_run["run"], umt_run["tmp"] / "umt.safetensors")
    report = _finetune_report(umt_run, exported, "export")
    assert report["backbone_matched_fraction"] == 1.0 and report["backbone_params"] > 0, report

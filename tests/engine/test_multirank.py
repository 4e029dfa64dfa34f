"""2-rank DeepSpeed runs on CPU (torchrun; the resumes and the bad-input exit through the deepspeed
launcher): ZeRO 0 / 2 / 3 and CPU offload give the same fp32 loss trajectory, and an interrupted +
resumed run (ZeRO-2, ZeRO-3) reproduces it exactly, ignoring a newer checkpoint that was killed
mid-save. Runs use a 3-clip val set and in-process decoding (``tiny_epic_quick``, ``QUICK_DATA``):
evaluation and the decode helper are other tests' subject.

The runs start in two launches (``tests/helpers/train_jobs.py``: the launcher and the ranks start once per
launch): the reference, the interrupted halves and the offload run through torchrun, then both resumed
halves, in new processes, through the deepspeed launcher."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import QUICK_DATA, REPO, launch, losses, write_recipe
from tests.helpers.launch import launch_jobs

pytestmark = pytest.mark.multiprocess
TOL = 1e-5  # measured: fp32 trajectories agree to ~1e-6 across stages and after resume
STAGES = ("zero2", "zero3")


def steps_per_epoch(data: dict) -> int:
    """drop_last DistributedSampler over 2 ranks, then drop_last micro-batches of 4, accum 1."""
    return (data["num_train"] // 2) // 4


def _job(tmp: Path, data: dict, name: str, ds: str, *extra: str) -> list[str | Path]:
    """The argv of one training job (its recipe written under ``tmp``; run dir ``tmp / name``)."""
    recipe = write_recipe(tmp / f"{name}.yaml", data, tmp / name, data=QUICK_DATA)
    return ["--config", recipe, "--deepspeed_config", REPO / "ds_configs" / f"{ds}.json", *extra]


def _impl(stage: str) -> list[str]:
    """ZeRO-3 also switches activation checkpointing to deepspeed.checkpointing (the JSON's section)."""
    return ["--set", "model.activation_checkpoint_impl=deepspeed"] if stage == "zero3" else []


def _cut_mid_save(run: Path, stop: int) -> None:
    """A newer checkpoint killed mid-save (shards but no COMPLETE marker), named latest: resume must ignore it."""
    partial = run / "checkpoints" / f"step_{stop + 1:08d}"
    shutil.copytree(run / "checkpoints" / f"step_{stop:08d}", partial)
    (partial / "COMPLETE.json").unlink()
    (run / "checkpoints" / "latest").write_text(partial.name)


@pytest.fixture(scope="module")
def runs(tiny_epic_quick: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted ZeRO-0 reference (2 epochs of 4 steps), the ZeRO-2 / ZeRO-3 runs interrupted one step
    into the second epoch (torchrun) and resumed in new processes (the deepspeed launcher), and a ZeRO-3 +
    CPU offload run of 2 steps. ZeRO-3 jobs last in each launch (train_jobs.py)."""
    tmp, data = tmp_path_factory.mktemp("multirank"), tiny_epic_quick
    stop = steps_per_epoch(data) + 1  # one step into the second epoch: resume mid-epoch
    first = [
        _job(tmp, data, "ref", "zero0"),
        *[_job(tmp, data, s, s, "--exit-after-steps", str(stop), *_impl(s)) for s in STAGES],
        _job(tmp, data, "offload", "zero3_offload", "--exit-after-steps", "2"),
    ]
    ref, *cut, offload = launch_jobs(first, tmp / "first.json")
    interrupted = {s: losses(tmp / s) for s in STAGES}
    for s in STAGES:
        _cut_mid_save(tmp / s, stop)
    resumed = launch_jobs([_job(tmp, data, s, s, *_impl(s)) for s in STAGES], tmp / "resume.json", launcher="deepspeed")
    return {
        "ref": {"run": tmp / "ref", "log": ref, "losses": losses(tmp / "ref")},
        "stop": stop,
        **{s: {"run": tmp / s, "interrupted": interrupted[s], "log": log} for s, log in zip(STAGES, resumed)},
        "offload": {"run": tmp / "offload", "log": offload},
        "cut_logs": dict(zip(STAGES, cut)),
    }


def test_zero0_run_logs_checkpoints_and_evaluates(runs: dict, tiny_epic_quick: dict) -> None:
    reference = runs["ref"]
    run, got = reference["run"], reference["losses"]
    spe = steps_per_epoch(tiny_epic_quick)
    assert sorted(got) == list(range(1, 2 * spe + 1))
    assert "world 2 | ZeRO-0 | fp32" in reference["log"]
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "loss" in r)
    for key in ("lr", "grad_norm", "clips_per_s", "data_wait_s", "compute_s", "data_wait_frac", "peak_gib"):
        assert step[key] is not None and step[key] >= 0, key
    evals = [r for r in rows if "eval" in r]
    assert len(evals) == 2 and "action_top1" in evals[-1]["eval"]
    assert (run / "recipe.yaml").is_file() and (run / "ds_config.json").is_file()
    assert json.loads((run / "ds_config.json").read_text())["gradient_clipping"] == 1.0
    assert list((run / "tb").glob("events.out.tfevents.*"))
    from avion_ds.engine.run_checkpoints import complete_tags

    last = 2 * spe  # every 2 steps + epoch end, keep the last 2
    assert complete_tags(run) == [f"step_{last - 2:08d}", f"step_{last:08d}"]


@pytest.mark.parametrize("stage", STAGES)
def test_resume_reproduces_uninterrupted_run(stage: str, runs: dict) -> None:
    """Interrupted half through torchrun, resumed half through the deepspeed launcher."""
    stop, run, ref = runs["stop"], runs[stage]["run"], runs["ref"]["losses"]
    assert sorted(runs[stage]["interrupted"]) == list(range(1, stop + 1))
    log = runs[stage]["log"]
    assert f"resumed from step_{stop:08d}: epoch 1, step 1 in epoch" in log
    assert f"activation checkpointing {'deepspeed' if _impl(stage) else 'torch'}" in log
    assert f"ZeRO-{stage[-1]}" in runs["cut_logs"][stage] and f"ZeRO-{stage[-1]}" in log
    resumed = losses(run)
    assert sorted(resumed) == sorted(ref)
    for s in ref:
        assert resumed[s] == pytest.approx(ref[s], abs=TOL), (s, resumed[s], ref[s])
    # consolidated fp32 weights (rundir.consolidate: ZeRO-2/3 shards, module state for ZeRO-0) agree too
    from avion_ds.engine.export import consolidate

    mine, base = consolidate(run), consolidate(runs["ref"]["run"])
    assert sorted(mine) == sorted(base)
    for k in base:
        torch.testing.assert_close(mine[k], base[k], rtol=0, atol=1e-5, msg=k)


def test_cpu_offload_matches(runs: dict) -> None:
    assert "ZeRO-3" in runs["offload"]["log"]
    got, ref = losses(runs["offload"]["run"]), runs["ref"]["losses"]
    assert sorted(got) == [1, 2]
    for s in got:
        assert got[s] == pytest.approx(ref[s], abs=1e-4), (s, got[s], ref[s])


def test_on_error_raise_is_one_line_exit_2_on_every_rank(tiny_epic: dict, tmp_path: Path) -> None:
    """`data.on_error: raise` on 2 ranks: one line naming the file and reason, exit 2, no tracebacks,
    no broken-connection noise from the rank that did not meet the bad file."""
    from tests.engine.test_single_process import truncate_one_video

    data, files = truncate_one_video(tiny_epic, tmp_path)
    recipe = write_recipe(
        tmp_path / "r.yaml",
        data,
        tmp_path / "run",
        data={"on_error": "raise"},
        schedule={"epochs": 1},
        checkpoint={"every_steps": 0},
    )
    proc = launch(
        ["--config", str(recipe), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json")], launcher="deepspeed"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    # stderr otherwise holds only torch's own start-up warnings ("W... No CUDA runtime is found")
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("W")]
    assert len(errors) == 1 and errors[0].startswith("avion-ds train: error: "), proc.stderr[-4000:]
    assert any(f"{f}: " in errors[0] for f in files) and "could not decode" in errors[0]  # file + reason
    assert "Traceback" not in out and "Connection closed" not in out and "gloo" not in out.lower()
    assert out.count("exits with return code = 2") >= 1 and "return code = 1" not in out

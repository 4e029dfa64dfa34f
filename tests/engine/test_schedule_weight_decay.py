"""``optim.weight_decay_end``: cosine weight decay over the run on the decayed groups only (VideoMAE / AVION
fine-tuning's ``wd_schedule``), logged every logged step and resumed with the schedule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.distributed.run_log import RunLogger
from avion_ds.engine.schedule import WarmupCosine
from tests.engine.tiny_trainer import batches, tiny_trainer

WD, WD_END = 0.05, 0.2


def avion_cosine_scheduler(base_value, final_value, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0):
    """AVION's ``avion/optim/schedulers.py: cosine_scheduler`` (VideoMAE's), verbatim."""
    warmup_schedule = np.array([])
    warmup_iters = warmup_epochs * niter_per_ep
    if warmup_epochs > 0:
        warmup_schedule = np.linspace(start_warmup_value, base_value, warmup_iters)
    iters = np.arange(epochs * niter_per_ep - warmup_iters)
    schedule = final_value + 0.5 * (base_value - final_value) * (1 + np.cos(np.pi * iters / len(iters)))
    schedule = np.concatenate((warmup_schedule, schedule))
    assert len(schedule) == epochs * niter_per_ep
    return schedule


def _groups() -> torch.optim.Optimizer:
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    return torch.optim.SGD(
        [{"params": [a], "weight_decay": WD, "lr_scale": 0.5}, {"params": [b], "weight_decay": 0.0}], lr=1.0
    )


def test_decayed_groups_follow_avions_wd_schedule_and_resume() -> None:
    epochs, per_epoch = 3, 4
    ref = avion_cosine_scheduler(WD, WD_END, epochs, per_epoch)
    opt, plain = _groups(), _groups()
    sched = WarmupCosine(opt, 1e-3, 1e-6, 2, epochs * per_epoch, weight_decay=(WD, WD_END))
    lr_only = WarmupCosine(plain, 1e-3, 1e-6, 2, epochs * per_epoch)
    for it in range(epochs * per_epoch):  # AVION sets param_group["weight_decay"] = wd_schedule[it] before step it
        assert opt.param_groups[0]["weight_decay"] == pytest.approx(ref[it], rel=1e-12, abs=0)
        assert opt.param_groups[1]["weight_decay"] == 0.0  # no-decay group untouched
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in plain.param_groups]
        if it == 5:
            resumed = WarmupCosine(_groups(), 1e-3, 1e-6, 2, epochs * per_epoch, weight_decay=(WD, WD_END))
            resumed.load_state_dict(sched.state_dict())
            assert [g["weight_decay"] for g in resumed.optimizer.param_groups] == [ref[it], 0.0]
        sched.step()
        lr_only.step()
    assert lr_only.optimizer.param_groups[0]["weight_decay"] == WD  # without the option: constant


@pytest.mark.multiprocess  # trains a DeepSpeed engine in this process
def test_schedule_is_applied_logged_and_resumed(one_rank: None, tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = RunLogger(run, True, tensorboard=False, progress=False, log_every=1)
    t = tiny_trainer("zero0.json", run, f"optim.weight_decay_end={WD_END}", accum=1, log=log)
    ref = avion_cosine_scheduler(WD, WD_END, 1, 100)  # tiny_trainer: 1 epoch of 100 steps
    data = batches()
    for _ in range(3):
        assert t.train_step(data)
    log.close()
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [r["weight_decay"] for r in rows] == pytest.approx(list(ref[:3]), rel=1e-12)  # the wd each step used
    groups = t.engine.optimizer.param_groups
    assert sorted({g["weight_decay"] for g in groups}) == pytest.approx([0.0, ref[3]], rel=1e-12)
    t.save()
    fresh = tiny_trainer("zero0.json", run, f"optim.weight_decay_end={WD_END}", accum=1)
    assert fresh.resume()
    assert [g["weight_decay"] for g in fresh.engine.optimizer.param_groups] == [g["weight_decay"] for g in groups]


def test_warmup_start_is_avions_linspace_and_bounds_scale_like_lr() -> None:
    """``schedule.warmup_start_lr``: AVION's ``cosine_scheduler(lr, lr_end, ..., start_warmup_value)``, step by
    step; ``optim.scale_lr_bounds`` scales the start and the end as main_lavila_finetune_cls.py lines 216-218."""
    from avion_ds.engine.schedule import cosine_lr

    epochs, per_epoch, warmup_epochs = 4, 5, 2
    base, start, end = 3e-3, 1e-6, 1e-5
    ref = avion_cosine_scheduler(base, end, epochs, per_epoch, warmup_epochs, start)
    ours = [cosine_lr(i, base, end, warmup_epochs * per_epoch, epochs * per_epoch, start) for i in range(20)]
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=0)


def test_recipe_bounds_scale_with_the_batch(one_rank: None, tmp_path: Path) -> None:
    """A recipe with AVION CLS's lr 3e-3 per 128 clips, lr_start 1e-6, lr_end 1e-5, all scaled (global 4 here)."""
    trainer = tiny_trainer(
        "zero0.json",
        tmp_path,
        "optim.lr=3e-3",
        "optim.base_batch=128",
        "optim.scale_lr=true",
        "optim.scale_lr_bounds=true",
        "optim.layer_decay=1.0",
        "optim.min_lr=1e-5",
        "schedule.warmup_start_lr=1e-6",
        "schedule.warmup_epochs=0.02",  # 2 of the 100 steps
        accum=2,
    )
    sched = trainer.engine.lr_scheduler
    factor = 4 / 128
    assert sched.warmup_start == pytest.approx(1e-6 * factor) and sched.min_lr == pytest.approx(1e-5 * factor)
    assert sched.base_lr == pytest.approx(3e-3 * factor) and sched.warmup_steps == 2
    assert trainer.engine.optimizer.param_groups[0]["lr"] == pytest.approx(1e-6 * factor)  # the first step's lr


def test_a_rising_weight_decay_schedule_is_allowed_and_rises() -> None:
    """optim.weight_decay_end above optim.weight_decay is accepted (DINO-style recipes raise weight decay;
    docs/training.md says so): the same cosine formula, from the start value up to the end value."""
    import itertools

    from avion_ds.engine.schedule import cosine_wd
    from avion_ds.tasks import load_recipe

    r = load_recipe(None, ["data.dataset=kinetics", "optim.weight_decay=0.04", "optim.weight_decay_end=0.4"])
    assert (r.optim.weight_decay, r.optim.weight_decay_end) == (0.04, 0.4)
    values = [cosine_wd(s, 0.04, 0.4, 100) for s in range(101)]
    assert values[0] == pytest.approx(0.04) and values[-1] == pytest.approx(0.4)
    assert all(a <= b for a, b in itertools.pairwise(values))

"""TrainState through a real checkpoint, and the client-state keys older checkpoints have."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from avion_ds.engine.train_state import TrainState
from tests.engine.tiny_trainer import batches, tiny_trainer

pytestmark = pytest.mark.multiprocess  # trains a DeepSpeed engine in this process
# the client state train.run wrote before the Trainer existed (resume of older run dirs relies on them)
LEGACY_KEYS = {
    "epoch",
    "step_in_epoch",
    "global_step",
    "skipped",
    "bad_samples",
    "applied_steps",
    "overflow_steps",
    "model",
    "scheduler",
    "rng",
}


def test_train_state_round_trips_through_a_checkpoint(one_rank: None, tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = tiny_trainer("zero2.json", run, accum=1)
    data = batches()
    for _ in range(3):
        assert trainer.train_step(data)
    st = trainer.state
    assert (st.global_step, st.step_in_epoch, st.applied_steps) == (3, 3, 3)
    trainer.state = TrainState(
        epoch=1, step_in_epoch=2, global_step=3, skipped=4, bad_samples=5, applied_steps=2, overflow_steps=1
    )
    tag = trainer.save()
    client = torch.load(run / "checkpoints" / tag / "client_rank0.pt", weights_only=False)
    assert set(client) == LEGACY_KEYS
    assert client["scheduler"]["last_step"] == 3  # the schedule saved with it

    fresh = tiny_trainer("zero2.json", run, accum=1)
    assert fresh.state == TrainState()
    assert fresh.resume()
    assert fresh.state.state_dict() == trainer.state.state_dict()
    assert fresh.engine.lr_scheduler.state_dict() == trainer.engine.lr_scheduler.state_dict()
    a = {k: v for k, v in trainer.engine.module.state_dict().items()}
    assert all(torch.equal(v, fresh.engine.module.state_dict()[k]) for k, v in a.items())


def test_older_client_state_loads_with_defaults() -> None:
    st = TrainState()
    st.load_state_dict({"epoch": 2, "step_in_epoch": 0, "global_step": 9, "model": {}, "rng": None})
    assert st == TrainState(
        epoch=2, step_in_epoch=0, global_step=9, skipped=0, bad_samples=0, applied_steps=9, overflow_steps=0
    )

"""``plan --measure`` times the training loop's own step: its probe goes through ``Trainer.train_step``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from avion_ds.engine.memory_probe import measure_candidates
from avion_ds.engine.trainer import Trainer
from avion_ds.memory.plan import Candidate


@pytest.mark.multiprocess  # trains a DeepSpeed engine in this process
def test_planner_probe_runs_the_trainers_step(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = Trainer.train_step

    def spy(self: Trainer, batches: Any) -> bool:
        before = self.state.global_step
        done = real(self, batches)
        calls.append((self.engine.zero_optimization_stage(), done, self.state.global_step - before))
        return done

    monkeypatch.setattr(Trainer, "train_step", spy)
    cand = Candidate(
        zero_stage=2, offload="none", offload_device="cpu", checkpoint_every=1, micro_batch=2, grad_accum=1
    )
    req = SimpleNamespace(model="vit_test_tiny", frames=4, size=32, dtype="fp32", nvme_path=None, gpus=1)
    measure_candidates([cand], req, steps=2)
    assert cand.measured_clips_per_s and cand.measured_clips_per_s > 0, cand
    assert calls == [(2, True, 1)] * 3  # 1 warm-up + 2 timed optimizer steps, each one Trainer step

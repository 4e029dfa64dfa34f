"""``model.compile: true`` through the real training path (``parallelize`` -> DeepSpeed engine ->
``Trainer.train_step``) under ZeRO 0, 1 and 2: the compiled run's losses equal the eager run's within
1e-5 (step 1: forward; step 2: after one optimizer step, so backward and the update too), and the run
log carries the first step's time. ZeRO-3 is refused in one line (tests/engine/test_train_errors.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from avion_ds.distributed.run_log import RunLogger
from tests.engine.tiny_trainer import batches, tiny_trainer

LOG = ["logging.log_every=1", "logging.tensorboard=false", "logging.progress=false"]
CASES = {  # ZeRO stage -> checkpointing alongside the compiled blocks
    0: [],
    1: ["model.activation_checkpointing=true", "model.activation_checkpoint_policy=full"],
    2: ["model.activation_checkpointing=true", "model.activation_checkpoint_policy=selective"],
}


def _two_steps(stage: int, run: Path, compiled: bool) -> list[float]:
    overrides = [*LOG, *CASES[stage], f"model.compile={str(compiled).lower()}"]
    log = RunLogger(run, True, tensorboard=False, progress=False, log_every=1)  # what `avion-ds train` writes
    trainer = tiny_trainer(f"zero{stage}.json", run, *overrides, accum=1, log=log)
    blocks = trainer.engine.module.blocks
    assert all(hasattr(b, "_compiled_call_impl") and (b._compiled_call_impl is not None) == compiled for b in blocks)
    data = batches()
    for _ in range(2):
        assert trainer.train_step(data)
    log.close()
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows]


@pytest.mark.parametrize("stage", sorted(CASES), ids=lambda s: f"zero{s}")
def test_compiled_blocks_train_like_eager(
    stage: int, one_rank: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    torch._dynamo.reset()
    eager = _two_steps(stage, tmp_path / "eager", compiled=False)
    assert "first step" not in capsys.readouterr().out
    counters.clear()
    compiled = _two_steps(stage, tmp_path / "compiled", compiled=True)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo traced the blocks (no silent eager fallback)
    out = capsys.readouterr().out
    assert len(eager) == len(compiled) == 2
    assert eager[0] != eager[1]  # the optimizer step changed the model
    for e, c in zip(eager, compiled, strict=True):
        assert abs(e - c) <= 1e-5, (eager, compiled)
    lines = [ln for ln in out.splitlines() if ln.startswith("first step")]
    assert len(lines) == 1 and re.fullmatch(r"first step \d+\.\d s \(model\.compile: compiles each block\)", lines[0])

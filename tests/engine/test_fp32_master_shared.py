"""fp32 ZeRO-3: the optimizer's fp32 master partition is the parameter partition (no second copy),
and training is the same as with DeepSpeed's copy."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import pytest
import torch

import avion_ds.engine.parallelize as parallelize_mod

pytestmark = pytest.mark.multiprocess


def _losses(run_dir: Path, steps: int = 3) -> tuple[list[float], bool]:
    from tests.engine.tiny_trainer import batches, tiny_trainer

    torch.manual_seed(0)
    t = tiny_trainer("zero3.json", run_dir, accum=1)
    opt = t.engine.optimizer
    shared = all(
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        for a, b in zip(opt.fp32_partitioned_groups_flat, opt.fp16_partitioned_groups_flat, strict=True)
    )
    losses = []
    for batch in itertools.islice(batches(), steps):
        x, y = t._on_device(batch)
        loss, _ = t.task.loss(t.engine, x, y, t.dtype, t.recipe)
        t.engine.backward(loss)
        t.engine.step()
        losses.append(loss.item())
    return losses, shared


def test_fp32_zero3_master_shares_the_partition_and_trains_the_same(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("deepspeed")
    shared_losses, shared = _losses(tmp_path / "shared")
    assert shared
    monkeypatch.setattr(parallelize_mod, "fp32_master_shared", lambda cfg: contextlib.nullcontext())
    copied_losses, copied = _losses(tmp_path / "copied")
    assert not copied  # DeepSpeed on its own clones the partition (what the context manager avoids)
    assert shared_losses == pytest.approx(copied_losses, rel=1e-6, abs=1e-9)
    assert shared_losses[0] != shared_losses[-1]

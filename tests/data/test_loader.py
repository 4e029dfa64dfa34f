"""DataLoader helper: worker determinism, epochs reaching persistent workers, error counter."""

from __future__ import annotations

from dataclasses import replace

import torch

from avion_ds.data import build_dataset, build_loader, set_epoch


def _epoch(loader) -> list[tuple[int, torch.Tensor]]:
    out = []
    for b in loader:
        out += list(zip(b["index"].tolist(), b["frames"]))
    return out


def test_loader_workers_are_deterministic_and_see_epochs(epic_cfg) -> None:
    ds = build_dataset(epic_cfg, "train", seed=2)
    loader = build_loader(ds, batch_size=2, workers=2, shuffle=True, seed=5, drop_last=True, distributed=False)
    assert loader.persistent_workers and loader.num_workers == 2
    e0 = _epoch(loader)
    set_epoch(loader, 1)
    e1 = _epoch(loader)
    set_epoch(loader, 0)
    again = _epoch(loader)
    assert [i for i, _ in e0] == [i for i, _ in again] and [i for i, _ in e0] != [i for i, _ in e1]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(e0, again))
    # same (seed, epoch, index) in the main process == in a worker
    i, frames = e1[0]
    fresh = build_dataset(epic_cfg, "train", seed=2)
    fresh.set_epoch(1)
    assert torch.equal(fresh[i]["frames"], frames)
    batch = next(iter(build_loader(ds, 4, 0, False, 0, False, False)))
    assert batch["frames"].shape == (4, 4, 32, 32, 3) and set(batch["label"]) == {"verb", "noun"}


def test_error_counter_sums_over_workers(epic_copy) -> None:
    root, cfg = epic_copy
    for chunk in root.glob("*/3.mp4"):
        chunk.write_bytes(b"")
    ds = build_dataset(replace(cfg, num_frames=2), "train")
    loader = build_loader(ds, batch_size=2, workers=2, shuffle=False, seed=0, drop_last=False, distributed=False)
    skipped = sum(int(b["skipped"].sum()) for b in loader)
    assert skipped > 0 and ds.errors == skipped


def test_distributed_needs_an_initialised_process_group(epic_cfg, monkeypatch) -> None:
    import pytest
    import torch.distributed

    # a process group an earlier in-process test left behind must not decide this test
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    ds = build_dataset(epic_cfg, "val")
    with pytest.raises(RuntimeError, match="torch.distributed to be initialised"):
        build_loader(ds, 2, 0, False, 0, False, distributed=True)
    with pytest.raises(ValueError, match="data.val_csv is empty"):
        build_dataset(replace(epic_cfg, val_csv=""), "val")

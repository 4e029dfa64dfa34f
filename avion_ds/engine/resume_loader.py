"""Resuming inside an epoch: the epoch's loader, started ``skip`` samples into its (already
epoch-seeded) sampler, so a resumed run reads exactly the samples the interrupted one had left. A shard
loader (``data.shards``: litdata's StreamingDataLoader) restores the position its ``state_dict()`` saved
with the checkpoint instead (:func:`shard_epoch`)."""

from __future__ import annotations

from typing import Any

import torch

from avion_ds.data.loader import set_epoch


class _SkipSampler(torch.utils.data.Sampler):
    """Yields ``sampler``'s indices after the first ``skip`` (resume inside an epoch)."""

    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i, idx in enumerate(self.sampler):
            if i >= self.skip:
                yield idx

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


def loader_skipping(loader: torch.utils.data.DataLoader, skip_samples: int) -> torch.utils.data.DataLoader:
    """A copy of ``loader`` that starts ``skip_samples`` into its (already epoch-seeded) sampler."""
    kw: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "timeout": loader.timeout,
    }
    if loader.num_workers > 0:
        kw.update(
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=False,
            multiprocessing_context=loader.multiprocessing_context,
        )
    return torch.utils.data.DataLoader(loader.dataset, sampler=_SkipSampler(loader.sampler, skip_samples), **kw)


def shard_epoch(loader: Any, epoch: int, position: dict[str, Any] | None) -> Any:
    """The shard ``loader`` at the start of ``epoch``, or at ``position`` (its ``state_dict()`` saved with a
    mid-epoch checkpoint of that epoch): litdata then skips what every rank and worker had read."""
    if position is not None:
        if int(position.get("current_epoch", -1)) != epoch + 1:  # litdata counts its epochs from 1
            raise ValueError(
                f"the checkpoint's shard loader position is of epoch {int(position.get('current_epoch', 0)) - 1}, "
                f"not of the resumed epoch {epoch}"
            )
        loader.load_state_dict(position)
    set_epoch(loader, epoch)
    return loader

"""DataLoader helper: pinned memory, persistent workers, epoch-seeded shuffling, deterministic workers.

Both the single-process and the distributed case use ``DistributedSampler`` (one replica when not
distributed) so shuffling is a pure function of (seed, epoch) and survives restarts; call
:func:`set_epoch` at the start of every epoch (it also reaches the dataset, whose epoch lives in
shared memory and so reaches persistent workers).
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from avion_ds.distributed.malloc import tune_malloc


def _seed_worker(worker_id: int) -> None:
    """Seed numpy / random from torch's per-worker seed (itself derived from the loader's generator).

    torch already runs each worker with one intra-op thread; the decoders use ``decoder_threads``
    (1) and the timeout helper one-thread math libraries, so N workers keep to about N cores. The
    worker's malloc keeps the clips' frame buffers for reuse (:func:`tune_malloc`).
    """
    tune_malloc()
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def build_loader(
    dataset: Dataset, batch_size: int, workers: int, shuffle: bool, seed: int, drop_last: bool, distributed: bool
) -> DataLoader:
    """A DataLoader over ``dataset`` (see module doc); ``distributed`` shards by torch.distributed rank.

    A shard dataset (``data.shards``: :mod:`avion_ds.data.shards`) gets litdata's ``StreamingDataLoader``:
    the dataset itself splits shards between ranks and workers and shuffles from its seed."""
    if getattr(dataset, "streams_shards", False):
        if distributed:
            dataset.find_ranks()
        return _shard_loader(dataset, batch_size, workers, seed, drop_last)
    if distributed:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("build_loader(distributed=True) needs torch.distributed to be initialised first")
        sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    else:
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed, drop_last=drop_last)
    gen = torch.Generator()
    gen.manual_seed(seed)
    kwargs = {}
    if workers > 0:
        kwargs = {"persistent_workers": True, "prefetch_factor": 2, "worker_init_fn": _seed_worker}
        if getattr(dataset, "decoder_name", None) == "torchcodec-cuda":
            kwargs["multiprocessing_context"] = "spawn"  # CUDA cannot be initialised in forked workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        drop_last=drop_last,
        generator=gen,
        **kwargs,
    )


def _shard_loader(dataset: Dataset, batch_size: int, workers: int, seed: int, drop_last: bool) -> DataLoader:
    """litdata's StreamingDataLoader over a shard dataset (its ``state_dict()`` is the exact mid-epoch position).

    Its worker seeds come from its own generator, never the global RNG: litdata starts the iterator at the
    first batch, which a resumed run reaches after restoring the global RNG (a draw there would shift it)."""
    from litdata import StreamingDataLoader  # lazy: litdata is the [stream] extra, loaded for shard datasets only

    gen = torch.Generator()
    gen.manual_seed(seed)
    kwargs = {"worker_init_fn": _seed_worker} if workers > 0 else {}
    return StreamingDataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        drop_last=drop_last,
        pin_memory=torch.cuda.is_available(),
        generator=gen,
        **kwargs,
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Reshuffle the sampler and re-seed the dataset's clip/crop draws for ``epoch``.

    A shard loader orders shards by its own epoch counter, which its next iteration advances: set to
    ``epoch`` here (unless a restored mid-epoch position holds it), so epoch ``e`` is shuffled alike in
    every run, resumed or not."""
    if getattr(loader.dataset, "streams_shards", False):
        if not loader.restore:
            loader.current_epoch = int(epoch)
        loader.dataset.set_clip_epoch(epoch)
        return
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)

"""`avion-ds bench-loader RECIPE`: how many DataLoader workers a GPU needs, measured on this machine.

Builds the recipe's training set (its decoder, crop, timeout helper: the path training uses) and
times it in the main process and through ``build_loader`` with each worker count, then prints
clips/s, clips/s per worker and, for ``--target`` clips/s (what one GPU consumes: global batch /
step time / GPUs), the workers needed::

    workers per GPU = ceil(target clips/s / clips/s per worker)

valid while every worker has a core of its own (each decodes with one thread); beyond that
per-worker throughput drops, which the 1 vs 2 (vs N) worker rows show.

    avion-ds bench-loader launch/recipes/vit_b_epic.yaml --workers 1,2 --target 40
"""

from __future__ import annotations

import math
import time


def clips_per_s_main(dataset, clips: int, warmup: int = 2, offset: int = 0) -> float:
    """Clips/s of ``dataset[i]`` in this process (one decoder process, this process's threads)."""
    n = len(dataset)
    for i in range(warmup):
        dataset[(offset + i) % n]
    t0 = time.perf_counter()
    for i in range(clips):
        dataset[(offset + warmup + i) % n]
    return clips / (time.perf_counter() - t0)


def clips_per_s_loader(dataset, workers: int, batch_size: int, batches: int, seed: int = 0) -> float:
    """Clips/s through ``build_loader`` with ``workers`` workers (after two warm-up batches)."""
    from avion_ds.data.loader import build_loader  # lazy: loads torch; `avion-ds` command help imports this module

    loader = build_loader(dataset, batch_size, workers, shuffle=True, seed=seed, drop_last=True, distributed=False)
    it = iter(loader)
    left = len(loader)
    if left < 3:
        raise ValueError(f"the training set gives {left} batches of {batch_size}: too few to time (need >= 3)")
    next(it)
    next(it)
    t0, n = time.perf_counter(), 0
    for _ in range(min(batches, left - 2)):
        n += next(it)["frames"].shape[0]
    rate = n / (time.perf_counter() - t0)
    del it, loader
    return rate


def workers_needed(target: float, per_worker: float) -> int:
    """ceil(target / per_worker): the formula printed for sizing workers per GPU."""
    return max(1, math.ceil(target / per_worker))

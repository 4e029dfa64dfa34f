"""Elastic resume: continue a ZeRO-1/2/3 run on a different number of ranks.

When the newest complete checkpoint was written by another world size, the same re-run command
converts it with DeepSpeed's ``ds_to_universal`` into ``<tag>/universal`` (atomically: a temp
folder renamed when done, so a kill -9 during the conversion never leaves a half checkpoint) and
the engine is built with ``checkpoint.load_universal``. What bites in deepspeed 0.19.x:

* checkpoints saved without universal info need ``--inject_missing_state``;
* ZeRO <= 2 writes no ``latest_universal``: the tag is loaded explicitly (``load_dir=<tag>``,
  ``tag="universal"``);
* ZeRO-3's universal load overwrites every param group's ``weight_decay`` with the first group's
  (no-decay groups start decaying: measured 1e-5 loss drift one step later), so the groups'
  weight decay and lr scale are put back after loading;
* per-rank client files (RNG streams) do not exist for new ranks: new rank r takes old rank r's
  file when it exists, else old rank ``r % old_world``'s counters with a fresh RNG stream derived
  from (global step, r), so no two ranks share a stream.

``ds_to_universal`` and DeepSpeed's loading unpickle the files in full: every ``*.pt`` of the tag is
checked with the safe loader before the conversion (``run_dir.check_tag_files``), and the client
files are read through it (``trust``: ``--trust-checkpoint``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avion_ds.config import ConfigError, Recipe
from avion_ds.distributed import dist
from avion_ds.distributed.rng import rng_state, set_rng_state
from avion_ds.storage import run_dir as rundir
from avion_ds.storage.safe_load import load_checkpoint_file

UNIVERSAL = "universal"
GROUP_SETTINGS = ("weight_decay", "lr_scale")  # per-group choices of this run, not checkpoint state
DONE = "UNIVERSAL_DONE.json"


def old_world_size(run_dir: str | Path) -> tuple[str, int] | None:
    """(tag, world size) of the newest complete checkpoint when it was written by another world
    size than this run's, else None."""
    tag = rundir.latest_complete(run_dir)
    if tag is None:
        return None
    marker = json.loads((rundir.checkpoint_dir(run_dir) / tag / rundir.MARKER).read_text())
    old = marker.get("world_size")
    if old is None or int(old) == dist.world_size():
        return None
    return tag, int(old)


def check_global_batch_kept(recipe: Recipe, tag: str) -> None:
    """Before any process group: resuming ``tag`` on another world size without ``batch.global_batch`` (the
    global batch is then micro x accum x world, so it changes with the world) is a ConfigError naming the key and
    both global batches, unless the micro-batch or accumulation was changed to keep it. A changed global batch
    changes the scaled lr and the steps of an epoch: a resumed epoch would end before its samples are read."""
    b = recipe.batch
    if b.global_batch is not None:
        return
    marker = json.loads((rundir.checkpoint_dir(recipe.output_dir) / tag / rundir.MARKER).read_text())
    old, world = marker.get("world_size"), dist.env_world_size()
    if old is None or int(old) == world:
        return
    now = b.micro_batch * (b.grad_accum or 1) * world
    before = _saved_global_batch(recipe.output_dir) or b.micro_batch * (b.grad_accum or 1) * int(old)
    if before != now:
        raise ConfigError(
            f"batch.global_batch: not set, and resuming {tag} of a {old}-rank run on {world} ranks changes the "
            f"global batch from {before} to {now} (micro {b.micro_batch} x accum {b.grad_accum or 1} x world): "
            f"the lr scaling and an epoch's steps would change, and a resumed epoch could end before its samples are "
            f"all read; set batch.global_batch={before}"
        )


def _saved_global_batch(run_dir: str | Path) -> int | None:
    """The global batch the run dir's previous start used (its ds_config.json), None when unknown."""
    try:
        value = json.loads((Path(run_dir) / "ds_config.json").read_text()).get("train_batch_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def convert_to_universal(tag_dir: Path) -> Path:
    """``tag_dir/universal`` (converted once; reused when complete). Run on one rank only."""
    out = tag_dir / UNIVERSAL
    if (out / DONE).is_file():
        return out
    tmp = tag_dir / rundir.UNIVERSAL_TMP
    shutil.rmtree(tmp, ignore_errors=True)  # a conversion killed earlier
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(tag_dir),
        "--output_folder",
        str(tmp),
        "--inject_missing_state",
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"ds_to_universal failed on {tag_dir} (exit {proc.returncode}): {tail}")
    (tag_dir / "latest_universal").unlink(missing_ok=True)  # written next to the output; we load by name
    (tmp / DONE).write_text(json.dumps({"source": tag_dir.name}))
    os.replace(tmp, out)
    return out


def prepare_resume(run_dir: str | Path, ds_config: dict[str, Any], trust: bool = False) -> str | None:
    """Before the engine exists: if the checkpoint to resume has another world size, check its files
    (every rank; ``UntrustedCheckpoint`` unless ``trust``), convert it (rank 0; the others wait) and
    switch ``ds_config`` to universal loading. Returns the log line."""
    found = old_world_size(run_dir)
    found = dist.broadcast_object(found)
    if found is None:
        return None
    tag, old = found
    tag_dir = rundir.checkpoint_dir(run_dir) / tag
    rundir.check_tag_files(tag_dir, trust)  # ds_to_universal unpickles them in full
    error = None
    if dist.is_main():
        try:
            convert_to_universal(tag_dir)
        except Exception as e:  # noqa: BLE001 - every rank fails with the same line
            error = str(e)
    error = dist.broadcast_object(error)
    if error is not None:
        raise RuntimeError(error)
    dist.barrier()
    ds_config.setdefault("checkpoint", {})["load_universal"] = True
    return (
        f"elastic resume: {tag} was written by {old} ranks, this run has {dist.world_size()}; "
        f"loading its universal checkpoint {tag_dir / UNIVERSAL}"
    )


def _fresh_rng(global_step: int, rank: int) -> dict[str, Any]:
    """An RNG state for a rank the old run did not have, without disturbing the current streams."""
    saved = rng_state()
    seed = (1_000_003 * (global_step + 1) + 7919 * rank) % 2**31
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    fresh = rng_state()
    set_rng_state(saved)
    return fresh


def client_for_rank(tag_dir: Path, old_world: int, rank: int, trust: bool = False) -> dict[str, Any]:
    """This rank's client state under the old -> new world mapping (see module docstring), read with
    the safe loader."""
    own = tag_dir / f"client_rank{rank}.pt"
    if rank < old_world and own.is_file():
        return load_checkpoint_file(own, trust)
    client = load_checkpoint_file(tag_dir / f"client_rank{rank % old_world}.pt", trust)
    client["rng"] = _fresh_rng(int(client.get("global_step", 0)), rank)
    return client


def load_universal(engine: Any, tag_dir: Path, old_world: int, trust: bool = False) -> dict[str, Any]:
    """Load ``tag_dir/universal`` into an engine built with ``checkpoint.load_universal``."""
    if not engine.load_universal_checkpoint():
        raise RuntimeError(
            "elastic resume: the engine was built without checkpoint.load_universal "
            "(call elastic.prepare_resume before deepspeed.initialize)"
        )
    groups = engine.optimizer.param_groups
    settings = [{k: g[k] for k in GROUP_SETTINGS if k in g} for g in groups]
    path, _ = engine.load_checkpoint(
        str(tag_dir), tag=UNIVERSAL, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load the universal checkpoint {tag_dir / UNIVERSAL}")
    for g, kept in zip(engine.optimizer.param_groups, settings):
        g.update(kept)  # ZeRO-3's universal load gives every group the first group's weight decay
    client = client_for_rank(tag_dir, old_world, dist.rank(), trust)
    client["tag"] = tag_dir.name
    return client

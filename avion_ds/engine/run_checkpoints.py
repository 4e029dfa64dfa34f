"""DeepSpeed checkpoints with completeness markers, keep-last-K pruning, auto-resume and run identity.

Layout of a run directory (``avion_ds.storage.run_dir``)::

    run.json                       model identity (resume into a different model is refused)
    checkpoints/step_00000120/     DeepSpeed shards (all ranks) + client_rank<r>.pt (per-rank state)
    checkpoints/step_00000120/COMPLETE.json   written by rank 0 after EVERY rank finished saving

A run killed mid-save leaves a tag without ``COMPLETE.json``; resume ignores it and loads the
newest complete tag. DeepSpeed's own ``latest`` file is never trusted for that reason.

DeepSpeed's ``load_checkpoint`` unpickles its files in full; before it opens a tag every ``*.pt`` of
the tag is read with the safe loader (``models.weights.safe_load``), and a file pickling anything outside the
allowlist stops the resume with one line unless ``trust`` (``--trust-checkpoint``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError, Recipe
from avion_ds.distributed import dist
from avion_ds.distributed.rng import rng_state
from avion_ds.engine.elastic import check_global_batch_kept, load_universal
from avion_ds.engine.preflight import check_checkpoint_tag
from avion_ds.models.listing import video_transformer_arch
from avion_ds.storage.run_dir import (
    BEST,
    CKPT_SUBDIR,
    MARKER,
    best_tag,
    check_tag_files,
    checkpoint_dir,
    complete_tags,
    latest_complete,
    read_best,
    tag_for,
    tag_step,
)
from avion_ds.storage.safe_load import load_checkpoint_file


# ---------------------------------------------------------------------------------------------
# run identity
# ---------------------------------------------------------------------------------------------
def model_identity(recipe: Recipe) -> dict[str, Any]:
    """What must match for a checkpoint to be resumable by this recipe's model; an unset ``pool`` /
    ``pos_embed`` is the registered model's own (what the run built, so leaving a key unset never
    changes the identity)."""
    m = recipe.model
    arch = video_transformer_arch(m.name)
    return {
        "name": m.name,
        "heads": m.heads if m.heads is not None else {"logits": m.num_classes},
        "num_frames": recipe.data.num_frames,
        "img_size": recipe.data.size,
        "patch_embed": m.patch_embed,
        "pool": m.pool if m.pool is not None else getattr(arch, "pool", None),
        "pos_embed": m.pos_embed if m.pos_embed is not None else getattr(arch, "pos_embed", None),
    }


def check_run_identity(run_dir: str | Path, recipe: Recipe) -> None:
    """Refuse (one line) to resume into a run directory written for a different model."""
    path = Path(run_dir) / "run.json"
    if not recipe.checkpoint.resume or not path.is_file():
        return
    try:
        old = json.loads(path.read_text()).get("model", {})
    except json.JSONDecodeError:
        raise ConfigError(f"{path} is not valid JSON; remove it or use another output_dir") from None
    new = model_identity(recipe)
    diff = [f"{k} {old.get(k)!r} -> {new[k]!r}" for k in new if old.get(k) != new[k]]
    if diff:
        raise ConfigError(
            f"output_dir {run_dir} holds checkpoints of a different model ({'; '.join(diff)}); "
            "use a new output_dir or set checkpoint.resume=false"
        )


RUN_FILES = ("best.json", "history.jsonl", "metrics.json", "tb")  # what a run leaves beside its checkpoints


def check_fresh_start(recipe: Recipe) -> None:
    """A fresh start (``checkpoint.resume: false`` / ``--resume-from none``) goes into a directory that
    holds no other run: its checkpoints would win over the new ones when pruning, its ``best.json`` would
    be evaluated as the new run's and its history mixed with the new one. Refused, one line."""
    run_dir = Path(recipe.output_dir)
    if recipe.checkpoint.resume or not run_dir.is_dir():
        return
    root = checkpoint_dir(run_dir)
    tags = sorted(p.name for p in root.iterdir() if tag_step(p.name) is not None) if root.is_dir() else []
    found = ([f"{CKPT_SUBDIR}/ ({len(tags)} tags, newest {tags[-1]})"] if tags else []) + [
        name for name in RUN_FILES if (run_dir / name).exists()
    ]
    if found:
        raise ConfigError(
            f"output_dir {run_dir} holds another run ({', '.join(found)}): a fresh start "
            "(--resume-from none / checkpoint.resume=false) would mix the two runs' files; move it away "
            f"(mv {run_dir} {run_dir}.old) or choose another output_dir, or resume it (drop --resume-from none)"
        )


def check_resume_source(recipe: Recipe, tag: str | None) -> None:
    """Before any process group: the files of the checkpoint a resume will load (``tag``, default the newest
    complete one) pass the safe loader's checks (``preflight.check_checkpoint_tag``); a fresh start goes
    into a directory without another run (:func:`check_fresh_start`); an elastic resume keeps its global batch
    (:func:`check_global_batch_kept`)."""
    check_fresh_start(recipe)
    tag = tag or (latest_complete(recipe.output_dir) if recipe.checkpoint.resume else None)
    if tag is not None:
        check_checkpoint_tag(checkpoint_dir(recipe.output_dir) / tag, recipe.model.trust_checkpoint, "resume")
        check_global_batch_kept(recipe, tag)


def write_run_identity(run_dir: str | Path, recipe: Recipe) -> None:
    if dist.is_main():
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        _atomic_write(Path(run_dir) / "run.json", json.dumps({"model": model_identity(recipe)}, indent=2))


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------
def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class NonFiniteWeights(RuntimeError):
    """The model holds NaN/Inf weights: nothing is saved (exit code 3)."""


def weights_finite(engine: Any) -> bool:
    """True when every rank's parameters (its ZeRO-3 partition) are finite; a collective."""
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import

    bad = 0.0
    for p in engine.module.parameters():
        t = getattr(p, "ds_tensor", None)
        t = p if t is None else t
        if t.numel() and not bool(torch.isfinite(t).all()):
            bad = 1.0
            break
    flag = dist.all_reduce_sum(torch.tensor([bad], device=get_accelerator().current_device_name()))
    return float(flag[0]) == 0.0


def save(
    engine: Any,
    run_dir: str | Path,
    global_step: int,
    client: dict[str, Any],
    keep_last: int,
    rank_files: dict[str, Any] | None = None,
) -> str:
    """Save a DeepSpeed checkpoint on all ranks, then mark it complete and prune old ones (rank 0).

    ``rank_files``: more per-rank state, ``name -> object`` written as ``<name>_rank<r>.pt`` before the tag is
    marked complete (None: nothing on this rank), e.g. the weight EMA. Refuses (NonFiniteWeights, on every
    rank) to write a checkpoint whose weights are not finite.
    """
    root = checkpoint_dir(run_dir)
    tag = tag_for(global_step)
    if not weights_finite(engine):
        raise NonFiniteWeights(
            f"non-finite weights at global step {global_step}: checkpoint {tag} not written "
            f"(the newest complete one in {root} is kept)"
        )
    engine.save_checkpoint(
        str(root), tag=tag, client_state={"avion_ds": {k: v for k, v in client.items() if k != "rng"}}
    )
    torch.save({**client, "rng": rng_state()}, root / tag / f"client_rank{dist.rank()}.pt")
    for name, obj in (rank_files or {}).items():
        if obj is not None:
            torch.save(obj, root / tag / f"{name}_rank{dist.rank()}.pt")
    dist.barrier()  # every rank's shards and client state are on disk
    if dist.is_main():
        _atomic_write(
            root / tag / MARKER,
            json.dumps(
                {"tag": tag, "global_step": global_step, "epoch": client.get("epoch"), "world_size": dist.world_size()}
            ),
        )
        prune(run_dir, keep_last)
    dist.barrier()
    return tag


def prune(run_dir: str | Path, keep_last: int) -> None:
    """Delete complete tags beyond the newest ``keep_last`` (and the best one, ``best.json``) and incomplete
    tags older than the newest."""
    tags = complete_tags(run_dir)
    if not tags:
        return
    keep = set(tags[-max(1, keep_last) :]) | {best_tag(run_dir)}
    newest = tag_step(tags[-1]) or 0
    for p in checkpoint_dir(run_dir).iterdir():
        s = tag_step(p.name)
        if s is None or p.name in keep:
            continue
        if (p / MARKER).is_file() or s < newest:
            shutil.rmtree(p, ignore_errors=True)


def check_tag(run_dir: str | Path, tag: str, flag: str = "--resume-from") -> None:
    """``tag`` must be a complete checkpoint of ``run_dir`` (one line listing the complete ones)."""
    have = complete_tags(run_dir)
    if tag not in have:
        raise ConfigError(
            f"{flag} {tag!r}: not a complete checkpoint in {checkpoint_dir(run_dir)} "
            f"(complete: {', '.join(have) if have else 'none'})"
        )


def load_latest(engine: Any, run_dir: str | Path, tag: str | None = None, trust: bool = False) -> dict[str, Any] | None:
    """Load ``tag`` (default: the newest complete checkpoint) into ``engine``; returns this rank's client state.

    Every file of the tag is checked with the safe loader first (``UntrustedCheckpoint`` unless ``trust``)."""
    tag = tag or latest_complete(run_dir)
    tag = dist.broadcast_object(tag)  # all ranks agree even if the filesystem view lags
    if tag is None:
        return None
    root = checkpoint_dir(run_dir)
    marker = json.loads((root / tag / MARKER).read_text())
    check_tag_files(root / tag, trust)  # before DeepSpeed unpickles any of them in full
    if marker.get("world_size") not in (None, dist.world_size()):  # converted by elastic.prepare_resume
        return load_universal(engine, root / tag, int(marker["world_size"]), trust)
    path, _ = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {root / tag}")
    client_file = root / tag / f"client_rank{dist.rank()}.pt"
    client = load_checkpoint_file(client_file, trust)
    client["tag"] = tag
    return client


def record_best(
    run_dir: str | Path,
    metric: str,
    value: float,
    tag: str,
    epoch: int,
    global_step: int,
    keep_last: int | None = None,
) -> bool:
    """Rank 0: make ``tag`` the best checkpoint when ``value`` of ``metric`` beats ``best.json``'s (higher is
    better); True when it did. The record survives resume (it is read back from the run directory).
    ``keep_last``: prune again, so the checkpoint kept only as the former best goes now, not at the next save
    (else ``keep_last: 1`` ends a run with two checkpoints)."""
    old = read_best(run_dir)
    if old is not None and old.get("metric") == metric and float(old.get("value", float("-inf"))) >= value:
        return False
    record = {"metric": metric, "value": value, "tag": tag, "epoch": epoch, "global_step": global_step}
    _atomic_write(Path(run_dir) / BEST, json.dumps(record) + "\n")
    if keep_last is not None:
        prune(run_dir, keep_last)
    return True

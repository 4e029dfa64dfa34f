"""Layout of a training run directory and reading its weights back: below engine/ and models/weights.

::

    run.json                       model identity (resume into a different model is refused)
    checkpoints/step_00000120/     DeepSpeed shards (all ranks) + client_rank<r>.pt (per-rank state)
    checkpoints/step_00000120/COMPLETE.json   written by rank 0 after EVERY rank finished saving

``engine.run_checkpoints`` writes this layout; ``engine.export`` and ``models.weights.loading`` (a run directory
passed as ``pretrained=``) read it through :func:`consolidate`, so neither needs the other.

Every file is read through ``models.weights.safe_load`` (``weights_only`` + allowlist; ``trust`` opts out).
The ZeRO 1/2/3 shards are consolidated here, not by DeepSpeed's ``zero_to_fp32`` (which unpickles
them in full): the arithmetic is the one its ``deepspeed/utils/zero_to_fp32.py`` documents, and
each tensor is gathered from the memory-mapped shards only when asked for (``LazyTensor``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.storage.safe_load import UntrustedCheckpoint, load_checkpoint_file

MARKER = "COMPLETE.json"
CKPT_SUBDIR = "checkpoints"


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def tag_step(name: str) -> int | None:
    """The global step of a tag name ``step_XXXXXXXX``; None for anything else."""
    if not name.startswith("step_"):
        return None
    try:
        return int(name[5:])
    except ValueError:
        return None


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CKPT_SUBDIR


def complete_tags(run_dir: str | Path) -> list[str]:
    """Tags that carry a completeness marker, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    tags = [(s, p.name) for p in root.iterdir() if (s := tag_step(p.name)) is not None and (p / MARKER).is_file()]
    return [name for _, name in sorted(tags)]


BEST = "best.json"  # {"metric", "value", "tag", "epoch", "global_step"}: the checkpoint the task's best metric keeps


def read_best(run_dir: str | Path) -> dict | None:
    """The run's best-checkpoint record (``best.json``), or None."""
    path = Path(run_dir) / BEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def best_tag(run_dir: str | Path) -> str | None:
    """The tag ``best.json`` names when it is still a complete checkpoint, else None."""
    best = read_best(run_dir)
    tag = best.get("tag") if isinstance(best, dict) else None
    return tag if tag in complete_tags(run_dir) else None


def resolve_tag(run_dir: str | Path, tag: str | None, flag: str = "--tag") -> str | None:
    """``tag`` itself, or for ``best`` the tag ``best.json`` names (one line when there is none)."""
    if tag != "best":
        return tag
    found = best_tag(run_dir)
    if found is None:
        raise ConfigError(
            f"{flag} best: {run_dir} has no best checkpoint (best.json is written by tasks that keep one)"
        )
    return found


def latest_complete(run_dir: str | Path) -> str | None:
    """Newest complete tag, or None."""
    tags = complete_tags(run_dir)
    return tags[-1] if tags else None


def clean_key(name: str) -> str:
    """A state-dict key without the wrappers training adds (checkpoint wrapper, torch.compile, DDP)."""
    for seg in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(seg, "")
    return name.removeprefix("module.")


def skipped_note(run_dir: str | Path, tag: str) -> str | None:
    """One line when newer tags than ``tag`` exist without a marker (an unfinished save was passed over)."""
    step = tag_step(tag) or 0
    root = checkpoint_dir(run_dir)
    newer = (
        sorted(
            (s, p.name)
            for p in root.iterdir()
            if (s := tag_step(p.name)) is not None and s > step and not (p / MARKER).is_file()
        )
        if root.is_dir()
        else []
    )
    if not newer:
        return None
    return (
        f"note: {root / newer[-1][1]} has no {MARKER} (an unfinished save); using the newest complete checkpoint {tag}"
    )


def run_zero_stage(run_dir: Path, tag_dir: Path) -> int:
    """ZeRO stage a run was saved with (its ds_config.json, else guessed from the shard files)."""
    cfg = run_dir / "ds_config.json"
    if cfg.is_file():
        return DSPlan.of(json.loads(cfg.read_text())).zero_stage
    return 1 if any(tag_dir.glob("*zero_pp_rank_*_optim_states.pt")) else 0  # ZeRO-0 writes no optimizer shards


TEXT_FILES = ("latest", "latest_universal")  # DeepSpeed's tag pointers: text, never unpickled
UNIVERSAL_TMP = "universal.tmp"  # an elastic conversion in progress (or killed): never read, removed before the next


def _layout_refusal(tag_dir: Path, path: Path, why: str) -> ConfigError:
    return UntrustedCheckpoint(f"checkpoint {tag_dir}: {path} {why}; refused (nothing of the tag was read)")


def tag_files(tag_dir: Path) -> list[Path]:
    """Every pickle file (``*.pt``) a resume, conversion, evaluation or export of the tag may open, at any
    depth (DeepSpeed's ``universal/`` folder included), found without following anything out of it.

    A symlink is resolved: one whose target lies outside the tag is refused (``rglob`` would not even
    descend into a linked folder, and DeepSpeed would open what it points to); one inside is checked
    under its own name. A file other than ``*.pt``, ``*.json`` (markers) and DeepSpeed's ``latest``
    pointers, or anything that is neither file nor folder, is a layout we do not read: refused, one line
    naming it (``UntrustedCheckpoint``). The folder of an unfinished elastic conversion (``universal.tmp``,
    deleted before the next one, never loaded) is not walked."""
    root = Path(tag_dir).resolve()
    found: list[Path] = []
    pending = [Path(tag_dir)]
    while pending:
        folder = pending.pop()
        for entry in sorted(folder.iterdir()):
            try:
                real = entry.resolve()
            except (OSError, RuntimeError):  # a symlink loop
                raise _layout_refusal(tag_dir, entry, "is a symlink that resolves to nothing") from None
            if entry.is_symlink() and not real.is_relative_to(root):
                raise _layout_refusal(tag_dir, entry, f"is a symlink to {real}, outside the tag")
            if entry.is_dir():
                if entry.is_symlink() or (folder == Path(tag_dir) and entry.name == UNIVERSAL_TMP):
                    continue  # a link inside the tag: its target is walked itself; the temp folder is never read
                pending.append(entry)
            elif not entry.is_file():
                raise _layout_refusal(tag_dir, entry, "is neither a file nor a folder")
            elif entry.suffix == ".pt":
                found.append(entry)
            elif entry.suffix != ".json" and not entry.name.endswith(".json.tmp") and entry.name not in TEXT_FILES:
                raise _layout_refusal(
                    tag_dir,
                    entry,
                    "is not part of a checkpoint avion-ds reads (*.pt shards and states, *.json markers)",
                )
    return sorted(found)


def check_tag_files(tag_dir: Path, trust: bool = False) -> int:
    """Unpickle every file of :func:`tag_files` with the safe loader (tensors memory-mapped, then dropped)
    and return how many: DeepSpeed's ``load_checkpoint`` and ``ds_to_universal`` unpickle them in full, so
    a file pickling anything outside the allowlist is refused here first (``UntrustedCheckpoint`` naming
    it). With ``trust`` nothing is checked."""
    if trust:
        return 0
    files = tag_files(tag_dir)
    for f in files:
        load_checkpoint_file(f, mmap=True)
    return len(files)


# ---------------------------------------------------------------------------------------------
# consolidation: DeepSpeed shards -> one fp32 state dict
# ---------------------------------------------------------------------------------------------
# keys of DeepSpeed's checkpoint files (deepspeed/checkpoint/constants.py)
OPTIM, STAGE, PARTITIONS = "optimizer_state_dict", "zero_stage", "partition_count"
FLAT_Z12, FLAT_Z3, PADDINGS = "single_partition_of_fp32_groups", "fp32_flat_groups", "param_alignment_paddings"
MODEL_STATES = "mp_rank_00_model_states.pt"


@dataclass(frozen=True)
class LazyTensor:
    """One tensor of a consolidated checkpoint: shape and dtype known, values gathered from the
    (memory-mapped) shards by ``materialize``, so a caller can hold one tensor at a time."""

    shape: torch.Size
    dtype: torch.dtype
    gather: Callable[[], torch.Tensor]

    def materialize(self) -> torch.Tensor:
        return self.gather()


def _eager(t: torch.Tensor) -> LazyTensor:
    return LazyTensor(t.shape, t.dtype, lambda: t)


def _load(path: Path, trust: bool) -> Any:
    if not path.is_file():
        why = (
            f" ({MARKER} marks its tag complete: copied or deleted in part?)"
            if (path.parent / MARKER).is_file()
            else ""
        )
        raise ConfigError(f"checkpoint file missing: {path}{why}")
    return load_checkpoint_file(path, trust, mmap=True)


def _rank_of(path: Path) -> int:
    m = re.search(r"zero_pp_rank_(\d+)_", path.name)
    return int(m.group(1)) if m else -1


def _rank_files(tag_dir: Path, kind: str, world: int) -> list[Path]:
    """``*zero_pp_rank_<r>_mp_rank_00_<kind>.pt`` for r < ``world``; the first missing one is named."""
    found = {_rank_of(p): p for p in tag_dir.glob(f"*zero_pp_rank_*_mp_rank_00_{kind}.pt")}
    prefix = next(iter(found.values())).name.split("zero_pp_rank_")[0] if found else ""
    for r in range(world):
        if r not in found:
            _load(tag_dir / f"{prefix}zero_pp_rank_{r}_mp_rank_00_{kind}.pt", False)  # raises, naming it
    return [found[r] for r in range(world)]


def _span(parts: list[torch.Tensor], lo: int, hi: int) -> list[torch.Tensor]:
    """The pieces of ``torch.cat(parts)[lo:hi]`` without concatenating everything."""
    out, start = [], 0
    for t in parts:
        end = start + t.numel()
        if end > lo and start < hi:
            out.append(t[max(lo - start, 0) : min(hi, end) - start])
        start = end
    return out


def _joined(pieces: list[torch.Tensor], numel: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The first ``numel`` elements of the concatenated ``pieces`` as a new tensor of ``shape``."""
    if numel == 0 or not pieces:
        return torch.empty(shape, dtype=dtype)
    flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0].clone()
    return flat[:numel].view(shape)


def _gather12(parts: list[torch.Tensor], lo: int, n: int, shape: torch.Size) -> torch.Tensor:
    """ZeRO-1/2: elements [lo, lo + n) of one group's fp32 vector (the ranks' partitions end to end)."""
    return _joined(_span(parts, lo, lo + n), n, shape, parts[0].dtype)


def _gather3(flat: list[list[torch.Tensor]], lo: int, part: int, n: int, shape: torch.Size) -> torch.Tensor:
    """ZeRO-3: every rank's partition [lo, lo + part) of its flat groups, ranks in order, padding cut."""
    return _joined([p for groups in flat for p in _span(groups, lo, lo + part)], n, shape, flat[0][0].dtype)


def _zero12(shapes: list[dict], flat: list[list[torch.Tensor]], paddings: list | None, where: Path) -> dict:
    """ZeRO-1/2: group g's fp32 vector is the ranks' partitions end to end; its params lie in it in
    order, each followed by its alignment padding; the vector is padded to a multiple of 2 x world."""
    out: dict[str, LazyTensor] = {}
    world = len(flat)
    for g, group in enumerate(shapes):
        parts = [flat[r][g] for r in range(world)]
        avail = sum(t.numel() for t in parts)
        pads = paddings[g] if paddings is not None else [0] * len(group)
        if len(pads) != len(group):
            raise ConfigError(f"{where}: {len(pads)} alignment paddings for {len(group)} params in group {g}")
        offset = 0
        for (name, shape), pad in zip(group.items(), pads):
            shape, n = torch.Size(shape), math.prod(shape)
            out[name] = LazyTensor(shape, parts[0].dtype, partial(_gather12, parts, offset, n, shape))
            offset += n + pad
        align = 2 * world
        if math.ceil(offset / align) != math.ceil(avail / align):
            raise ConfigError(
                f"{where}: group {g} holds {avail} fp32 values, its params use {offset}: "
                "shards and param_shapes disagree"
            )
    return out


def _zero3(shapes: list[dict], flat: list[list[torch.Tensor]], where: Path) -> dict:
    """ZeRO-3: each param is split in ``world`` equal partitions (the last one zero-padded); rank r's
    flat fp32 groups hold its partition of every param in order."""
    out: dict[str, LazyTensor] = {}
    world = len(flat)
    offset = 0
    for name, shape in ((k, v) for group in shapes for k, v in group.items()):
        shape, n = torch.Size(shape), math.prod(shape)
        part = math.ceil(n / world)
        out[name] = LazyTensor(shape, flat[0][0].dtype, partial(_gather3, flat, offset, part, n, shape))
        offset += part
    avail = sum(t.numel() for t in flat[0])
    if offset != avail:
        raise ConfigError(f"{where}: the shards hold {avail} fp32 values per rank, the params use {offset}")
    return out


def _frozen(states: list[dict], stage: int) -> dict:
    """Frozen params (ZeRO >= 2 saves them in the model states): whole (ZeRO-2) or partitioned per rank (ZeRO-3)."""
    shapes = states[0].get("frozen_param_shapes") or {}
    out: dict[str, LazyTensor] = {}
    for name, shape in shapes.items():
        frags = [s["frozen_param_fragments"][name] for s in states]
        if stage <= 2:
            out[name] = _eager(frags[0])
        else:
            shape = torch.Size(shape)
            out[name] = LazyTensor(
                shape, frags[0].dtype, partial(_joined, frags, math.prod(shape), shape, frags[0].dtype)
            )
    return out


def zero_state_dict(tag_dir: str | Path, trust: bool = False) -> dict[str, LazyTensor]:
    """fp32 state dict of one ZeRO-1/2/3 checkpoint tag, lazily, with ``zero_to_fp32``'s keys, order
    (buffers, frozen params, trainable params, shared params) and values."""
    tag_dir = Path(tag_dir)
    marker = tag_dir / MARKER
    world = json.loads(marker.read_text()).get("world_size") if marker.is_file() else None
    if world is None:
        world = max(1, len(list(tag_dir.glob("*zero_pp_rank_*_optim_states.pt"))))
    optim_files = _rank_files(tag_dir, "optim_states", int(world))
    optims = [_load(f, trust)[OPTIM] for f in optim_files]
    stage, count = int(optims[0][STAGE]), optims[0][PARTITIONS]
    count = max(count) if isinstance(count, list) else int(count)
    if count != len(optims):
        raise ConfigError(f"{optim_files[0]}: written by {count} ranks, {len(optims)} optimizer shards found")
    model_files = [tag_dir / MODEL_STATES] if stage <= 2 else _rank_files(tag_dir, "model_states", len(optims))
    states = [_load(f, trust) for f in model_files]
    if "buffer_names" not in states[0]:
        raise ConfigError(f"{model_files[0]} is not a DeepSpeed model state file (no buffer_names)")
    buffers = {
        k: v.float() if v.is_floating_point() else v
        for k, v in states[0]["module"].items()
        if k in states[0]["buffer_names"]
    }
    out: dict[str, LazyTensor] = {k: _eager(v) for k, v in buffers.items()}
    out.update(_frozen(states, stage))
    if stage <= 2:
        out.update(_zero12(states[0]["param_shapes"], [o[FLAT_Z12] for o in optims], optims[0].get(PADDINGS), tag_dir))
    else:
        out.update(_zero3(states[0]["param_shapes"], [o[FLAT_Z3] for o in optims], tag_dir))
    for name, source in states[0].get("shared_params", {}).items():
        if source in out:
            out[name] = out[source]
    return _with_module_rest(out, states[0]["module"], stage, model_files[0])


def _with_module_rest(out: dict[str, LazyTensor], module: dict, stage: int, where: Path) -> dict[str, LazyTensor]:
    """``out`` plus every tensor of the module state the shards carry no values for: under ZeRO 1/2 the
    module state is whole (ZeRO-1 saves frozen params, e.g. a frozen ``logit_scale``, only there);
    under ZeRO-3 it holds placeholders, so a tensor missing there refuses (one line naming them)."""
    rest = [k for k in module if k not in out]
    if rest and stage >= 3:
        shown = ", ".join(rest[:4]) + (f", ... ({len(rest)} in all)" if len(rest) > 4 else "")
        raise ConfigError(f"{where}: no values for {shown} in the shards; refusing to consolidate without them")
    for k in rest:
        v = module[k]
        out[k] = _eager(v.float() if v.is_floating_point() else v)
    return out


def lazy_state_dict(run_dir: str | Path, tag: str | None = None, trust: bool = False) -> dict[str, LazyTensor]:
    """The weights of ``tag`` (default: newest complete checkpoint) in ``run_dir``, raw keys, lazily:
    ZeRO-0 from the module state, ZeRO 1/2/3 from the fp32 master partitions."""
    run_dir = Path(run_dir)
    tag = tag or latest_complete(run_dir)
    if tag is None:
        raise ConfigError(f"{run_dir}: no complete checkpoint under {checkpoint_dir(run_dir)}")
    tag_dir = checkpoint_dir(run_dir) / tag
    if not (tag_dir / MARKER).is_file():
        raise ConfigError(f"{tag_dir} is not a complete checkpoint (no {MARKER})")
    if not trust:
        tag_files(tag_dir)  # the layout: no symlink out of the tag, nothing we do not read
    if run_zero_stage(run_dir, tag_dir) == 0:
        return {k: _eager(v) for k, v in _load(tag_dir / MODEL_STATES, trust)["module"].items()}
    return zero_state_dict(tag_dir, trust)


def consolidate(run_dir: str | Path, tag: str | None = None, trust: bool = False) -> dict[str, torch.Tensor]:
    """fp32 state dict of ``tag`` (default: newest complete checkpoint) in ``run_dir``, clean keys."""
    done: dict[int, torch.Tensor] = {}  # shared params stay shared
    out = {}
    for k, lazy in lazy_state_dict(run_dir, tag, trust).items():
        if id(lazy) not in done:
            v = lazy.materialize()
            done[id(lazy)] = v.float() if v.is_floating_point() else v
        out[clean_key(k)] = done[id(lazy)]
    return out

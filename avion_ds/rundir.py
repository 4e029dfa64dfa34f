"""Layout of a training run directory and reading its weights back: below engine/ and models/.

::

    run.json                       model identity (resume into a different model is refused)
    checkpoints/step_00000120/     DeepSpeed shards (all ranks) + client_rank<r>.pt (per-rank state)
    checkpoints/step_00000120/COMPLETE.json   written by rank 0 after EVERY rank finished saving

``engine.checkpoint`` writes this layout; ``engine.export`` and ``models.pretrained`` (a run directory
passed as ``pretrained=``) read it through :func:`consolidate`, so neither needs the other.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from avion_ds.config import ConfigError

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


def latest_complete(run_dir: str | Path) -> str | None:
    """Newest complete tag, or None."""
    tags = complete_tags(run_dir)
    return tags[-1] if tags else None


def clean_key(name: str) -> str:
    """A state-dict key without the wrappers training adds (checkpoint wrapper, torch.compile, DDP)."""
    for seg in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(seg, "")
    return name.removeprefix("module.")


def run_zero_stage(run_dir: Path, tag_dir: Path) -> int:
    """ZeRO stage a run was saved with (its ds_config.json, else guessed from the shard files)."""
    cfg = run_dir / "ds_config.json"
    if cfg.is_file():
        return int(json.loads(cfg.read_text()).get("zero_optimization", {}).get("stage", 0))
    return 1 if any(tag_dir.glob("*optim_states.pt")) and not (tag_dir / "mp_rank_00_model_states.pt").is_file() else 0


def consolidate(run_dir: str | Path, tag: str | None = None) -> dict[str, torch.Tensor]:
    """fp32 state dict of ``tag`` (default: newest complete checkpoint) in ``run_dir``."""
    run_dir = Path(run_dir)
    tag = tag or latest_complete(run_dir)
    if tag is None:
        raise ConfigError(f"{run_dir}: no complete checkpoint under {checkpoint_dir(run_dir)}")
    tag_dir = checkpoint_dir(run_dir) / tag
    if not (tag_dir / MARKER).is_file():
        raise ConfigError(f"{tag_dir} is not a complete checkpoint (no {MARKER})")
    if run_zero_stage(run_dir, tag_dir) == 0:
        states = torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        sd = states["module"]
    else:
        from deepspeed.utils.zero_to_fp32 import (
            get_fp32_state_dict_from_zero_checkpoint,
        )

        sd = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir(run_dir)), tag=tag)
    return {clean_key(k): (v.float() if v.is_floating_point() else v) for k, v in sd.items()}

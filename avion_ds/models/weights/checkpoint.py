"""Reading a checkpoint for a load: the file read safely, its training wrappers stripped, and the state
dict handed to the model's own adapter (``model.prepare_checkpoint``: each family's ``weights`` module),
which maps and resizes it to the model's names and shapes. Nothing is loaded here
(:mod:`avion_ds.models.weights.loading` does).

Every registered model family implements ``prepare_checkpoint(source, trust=False, *, kinetics_head=False)
-> (state_dict, LoadReport)``: the video ViT (:mod:`avion_ds.models.vit.weights`), the pretraining model
(:mod:`avion_ds.models.mae.weights`) and the dual encoder (:mod:`avion_ds.models.clip.weights`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from avion_ds.models.weights.hf_config import declared_mean_std
from avion_ds.models.weights.report import LoadReport
from avion_ds.storage.run_dir import consolidate
from avion_ds.storage.safe_load import UntrustedCheckpoint, load_checkpoint_file

logger = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]


_WRAPPERS = ("model", "module", "state_dict", "model_state", "model_state_dict", "model_ema")
_PREFIXES = ("module.", "_orig_mod.", "model.", "backbone.")


def read_checkpoint(source: str | Path | dict, trust: bool = False) -> dict[str, Any]:
    """Read a checkpoint file (.safetensors, torch pickle) or HF directory into a dict.

    Pickles are unpickled with tensors and a small allowlist only (see ``safe_load``); other pickled
    objects raise ``UntrustedCheckpoint`` naming them unless ``trust``.
    """
    if isinstance(source, dict):
        return source
    path = Path(source)
    if path.is_dir() and (path / "checkpoints").is_dir() and not (path / "model.safetensors").is_file():
        logger.info("%s is a run directory: loading its latest complete checkpoint", path)
        return consolidate(path, trust=trust)
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin", "mp_rank_00_model_states.pt"):
            if (path / name).is_file():
                return read_checkpoint(path / name, trust)
        raise FileNotFoundError(f"checkpoint directory {path} holds no model.safetensors / pytorch_model.bin")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path), device="cpu")
        return load_checkpoint_file(path, trust)
    except UntrustedCheckpoint:
        raise
    except Exception as e:  # corrupt / truncated / not a checkpoint
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"cannot read checkpoint {path}: {msg}") from e


def checkpoint_state_dict(ckpt: dict[str, Any]) -> StateDict:
    """A read checkpoint's flat name -> tensor dict: training wrappers (``model`` / ``module`` /
    ``state_dict`` dicts, DDP / compile prefixes) stripped."""
    sd: Any = ckpt
    for _ in range(3):
        if isinstance(sd, dict) and not any(isinstance(v, torch.Tensor) for v in sd.values()):
            inner = next((sd[k] for k in _WRAPPERS if isinstance(sd.get(k), dict)), None)
            if inner is None:
                break
            sd = inner
    if not isinstance(sd, dict):
        raise TypeError(f"checkpoint: expected a dict of tensors, got {type(sd).__name__}")
    sd = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    for prefix in _PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix) :]: v for k, v in sd.items()}
    return sd


def prepare_state_dict(
    model: nn.Module, source: str | Path | dict, trust: bool = False, *, kinetics_head: bool = False
) -> tuple[StateDict, LoadReport]:
    """Read ``source`` and map / resize it to ``model``'s names and shapes through the model's own
    ``prepare_checkpoint`` (its family's weight adapter); nothing is loaded yet (``load_weights`` loads it,
    into a plain or a ZeRO-3 partitioned model; the start-up shape check runs it on shapes alone). A model
    without one is refused in one line. The report's ``mean_std`` is the format's, or what the files beside
    ``source`` state (``hf_config.declared_mean_std``). ``kinetics_head``: the model is trained on Kinetics,
    so a 710-row head becomes its 400 / 600 / 700 rows by the label map (VideoMAE V2; video ViT classifiers
    only)."""
    own = getattr(model, "prepare_checkpoint", None)
    if not callable(own):
        raise TypeError(
            f"pretrained weights load into a VideoViT or a VideoMAEPretrain, got {type(model).__name__} "
            "(load before deepspeed.initialize, into the bare model)"
        )
    sd, report = own(source, trust, kinetics_head=kinetics_head)
    take_declared_mean_std(report, source)
    return sd, report


def take_declared_mean_std(report: LoadReport, source: Any) -> None:
    """The normalisation the files beside ``source`` state, over the format's, with a note saying so (they
    say more than the format: ``hf_config.declared_mean_std``)."""
    declared = declared_mean_std(source)
    if declared is not None and declared != report.mean_std:
        theirs = f" (the format's: {report.mean_std})" if report.mean_std else ""
        report.notes.append(f"mean/std {declared} as stated beside the weights{theirs}")
        report.mean_std = declared

"""Generic weight loading: read a checkpoint file safely, strip training wrappers, hand the state dict to
the model's own adapter (``model.prepare_checkpoint``: each family's ``weights`` module), load it and
report what matched.

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

from avion_ds.models.partition import full_numel
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


def unwrap(ckpt: dict[str, Any]) -> StateDict:
    """Strip training wrappers (``model`` / ``module`` / ``state_dict`` dicts, DDP / compile
    prefixes) down to a flat name -> tensor dict."""
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
    ``prepare_checkpoint`` (its family's weight adapter); nothing is loaded yet (shared by
    ``load_pretrained`` and the ZeRO-3 loader in ``sharded``). A model without one is refused in one line.
    ``kinetics_head``: the model is trained on Kinetics, so a 710-row head becomes its 400 / 600 / 700
    rows by the label map (VideoMAE V2; video ViT classifiers only)."""
    own = getattr(model, "prepare_checkpoint", None)
    if not callable(own):
        raise TypeError(
            f"pretrained weights load into a VideoViT or a VideoMAEPretrain, got {type(model).__name__} "
            "(load before deepspeed.initialize, into the bare model)"
        )
    return own(source, trust, kinetics_head=kinetics_head)


def load_pretrained(
    model: nn.Module,
    source: str | Path | dict,
    strict: bool = False,
    trust: bool = False,
    *,
    coverage_check: bool = True,
    kinetics_head: bool = False,
) -> LoadReport:
    """Load ``source`` (path, HF directory, or a (wrapped) state dict) into ``model`` in place.

    ``model``: a fine-tuning ``VideoViT`` (any format; a pretraining checkpoint gives its encoder),
    a ``VideoMAEPretrain`` (the pretraining layouts) or a ``VideoTextDualEncoder`` (CLIP / OpenCLIP /
    AVION), each through its own ``prepare_checkpoint``. Returns a ``LoadReport``; ``strict=True``
    raises listing missing / unexpected / dropped keys; a load that leaves more than
    ``1 - MIN_BACKBONE_MATCH`` of the backbone's parameters out is an error whatever ``strict``
    (raised under ``strict``, logged at ERROR level otherwise; ``coverage_check=False`` leaves that
    check to a caller that reports coverage itself, e.g. the training entry's ``load_and_report``).
    ``trust`` allows full unpickling of a file that pickles more than weights (see ``read_checkpoint``);
    ``kinetics_head``: see ``prepare_state_dict``. Call before ``deepspeed.initialize`` (ZeRO-3 partitions
    parameters after that).
    """
    sd, report = prepare_state_dict(model, source, trust, kinetics_head=kinetics_head)
    result = model.load_state_dict(sd, strict=False)
    return finish_report(
        report, model, source, strict, result.missing_keys, result.unexpected_keys, coverage_check=coverage_check
    )


def finish_report(
    report: LoadReport,
    model: nn.Module,
    source: Any,
    strict: bool,
    missing: list[str],
    unexpected: list[str],
    coverage_check: bool = True,
) -> LoadReport:
    """Record what the load left out, warn about a dropped timm table, raise under ``strict``."""
    fmt = report.format
    report.missing = sorted(set(missing) - set(report.fresh))
    report.unexpected = sorted(unexpected)
    report.resized.sort()
    report.dropped.sort()
    report.remapped.sort()
    if fmt == "timm" and getattr(model.arch, "pos_embed", None) == "sincos" and "pos_embed" in report.unexpected:
        logger.warning(
            "timm checkpoint has a learned pos_embed but the model uses fixed sin-cos; "
            "create the model with pos_embed='learned' to keep it"
        )
    if strict and (report.missing or report.unexpected or report.dropped):
        raise ValueError(f"load_pretrained(strict=True) from {_name(source)}: {report.summary()}")
    matched, total = backbone_coverage(model, report.missing + report.fresh)
    if coverage_check and matched < MIN_BACKBONE_MATCH * total:
        logger.error(
            "pretrained %s matched %.1f%% of %s's backbone parameters (%d of %d; below %.0f%%): %s",
            _name(source),
            100 * matched / total,
            type(model).__name__,
            matched,
            total,
            100 * MIN_BACKBONE_MATCH,
            report.summary(),
        )
    return report


MIN_BACKBONE_MATCH = 0.9  # a load below this fraction of the backbone's parameters is an error
_HEADS = ("head.", "heads.")


def backbone_coverage(model: nn.Module, missing: list[str]) -> tuple[int, int]:
    """(loaded, total) parameter elements of ``model`` outside its classifier heads (logical sizes,
    also under ZeRO-3), given the parameter names the load left ``missing``."""
    absent = set(missing)
    matched = total = 0
    for name, p in model.named_parameters():
        if name.startswith(_HEADS):
            continue
        total += full_numel(p)
        matched += 0 if name in absent else full_numel(p)
    return matched, total


def _name(source: Any) -> str:
    return "a state dict" if isinstance(source, dict) else str(source)

"""Unpickle checkpoint files without running code from them: the ONE reader of every ``.pt`` / ``.pth``.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers (dicts, lists,
``OrderedDict``, ``torch.Size``, dtypes, ...). The few other types the checkpoints we read carry are
allowlisted through ``torch.serialization.safe_globals``: official VideoMAE / AVION checkpoints pickle
their training ``argparse.Namespace`` (with numpy scalars), our client states hold numpy's RNG state,
and DeepSpeed's ZeRO optimizer shards hold ``ZeroStageEnum``, ``LossScaler`` and ``fragment_address``
(found with ``torch.serialization.get_unsafe_globals_in_checkpoint`` on ZeRO 0-3 fp32 / bf16
checkpoints written by our trainer). Any other pickled object could execute code when unpickled: it is
refused with ``UntrustedCheckpoint`` (one line naming the file and the type), unless the caller opts
in (``--trust-checkpoint``: only from the command line, never from a run directory, see ``engine.trust``).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import logging
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from avion_ds.config import ConfigError

logger = logging.getLogger(__name__)

# pickled by DeepSpeed's ZeRO optimizers into *_optim_states.pt: plain data classes / an int enum
DEEPSPEED_TYPES = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
TRUST_HINT = "pass --trust-checkpoint on the command line only if you trust the file"


class UntrustedCheckpoint(ConfigError):
    """A checkpoint pickles objects outside the allowlist and the user did not opt in (exit 2, one line)."""


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def allowed_globals() -> list[Any]:
    """argparse.Namespace, collections.OrderedDict, numpy scalars / dtypes / arrays: data only."""
    multiarray = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    out: list[Any] = [
        argparse.Namespace,
        collections.OrderedDict,
        np.dtype,
        np.ndarray,
        multiarray.multiarray.scalar,
        multiarray.multiarray._reconstruct,
    ]
    out += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return out


def deepspeed_globals() -> list[Any]:
    """The DeepSpeed classes of ``DEEPSPEED_TYPES`` (imported only for files that pickle them)."""
    out = []
    for name in DEEPSPEED_TYPES:
        module, _, attr = name.rpartition(".")
        try:
            out.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):  # another DeepSpeed version: that name cannot be in its files
            continue
    return out


def _allowed_names() -> set[str]:
    names = set(DEEPSPEED_TYPES)
    for obj in allowed_globals():
        names.add(_qualname(obj))
        names.add(f"{obj.__module__.replace('numpy._core', 'numpy.core')}.{obj.__qualname__}")
    return names


def pickled_globals(path: Path) -> set[str] | None:
    """Classes / functions the pickle of a zip checkpoint names that torch does not allow by default,
    read from its ``data.pkl`` alone (no tensor data, nothing unpickled). None when it cannot tell
    (legacy format, unusual opcodes): the ``weights_only`` unpickler then decides alone."""
    try:
        return set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # noqa: BLE001 - the scan only names types early; torch.load enforces
        return None


def _unpickler_reason(e: Exception) -> str:
    """The line of torch's weights-only error that says what failed (it wraps it in advice)."""
    text = str(e)
    m = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", text, re.DOTALL)
    return (m.group(1) if m else text.strip().splitlines()[0]).strip()[:160]


def _refusal(path: Path, names: list[str]) -> UntrustedCheckpoint:
    return UntrustedCheckpoint(
        f"checkpoint {path} pickles Python objects that are not weights ({', '.join(names)}); unpickling them "
        f"could run code, so it is refused: {TRUST_HINT}"
    )


def load_checkpoint_file(path: str | Path, trust: bool = False, *, mmap: bool = False) -> Any:
    """``torch.load`` a pickle checkpoint onto the CPU with tensors and the allowlisted types only.

    ``mmap``: tensors stay in the (zip-format) file, read when used (DeepSpeed shards: one tensor at a
    time). ``trust``: anything is unpickled (logged). Else a file pickling other types raises
    ``UntrustedCheckpoint`` naming it and them; nothing of it is executed."""
    path = Path(path)
    mmap = mmap and zipfile.is_zipfile(path)
    found = pickled_globals(path)
    bad = sorted(found - _allowed_names()) if found is not None else []
    if not bad:
        allow = allowed_globals() + (deepspeed_globals() if found and found & set(DEEPSPEED_TYPES) else [])
        try:
            with torch.serialization.safe_globals(allow):
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            bad = re.findall(r"GLOBAL ([\w.]+)", str(e))
            if not bad and not trust:  # not a type the allowlist lacks: the file is no (weights-only) checkpoint
                raise ConfigError(
                    f"checkpoint {path} cannot be read as a PyTorch checkpoint ({_unpickler_reason(e)}); {TRUST_HINT}"
                ) from None
    if not trust:
        raise _refusal(path, bad)
    logger.warning("%s: trusted checkpoint loaded with full unpickling (weights_only=False)", path)
    return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)


def check_checkpoint_file(path: str | Path, trust: bool = False) -> None:
    """Refuse, before any work starts, a weights file the loaders would refuse, reading as little as
    possible: a safetensors header, a zip checkpoint's pickle (its types, nothing unpickled); other
    files are loaded once with the safe loader. Raises ``UntrustedCheckpoint`` / ``ConfigError``."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except Exception as e:  # noqa: BLE001 - any failure to parse the header means an unreadable file
            raise ConfigError(f"checkpoint {path} is not a readable safetensors file ({str(e)[:160]})") from None
        return
    found = pickled_globals(path) if zipfile.is_zipfile(path) else None
    if found is None:
        if not trust:
            load_checkpoint_file(path, mmap=True)
        return
    bad = sorted(found - _allowed_names())
    if bad and not trust:
        raise _refusal(path, bad)

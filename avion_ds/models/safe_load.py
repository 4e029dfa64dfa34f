"""Unpickle downloaded checkpoints without running code from them.

``torch.load(weights_only=True)`` only rebuilds tensors and plain containers. Official VideoMAE
checkpoints also pickle their training ``argparse.Namespace`` (which may hold numpy scalars), so
those few harmless types are allowlisted through ``torch.serialization.safe_globals``. Any other
pickled object could execute code when unpickled: it is refused with one line naming its type,
unless the caller opts in (``model.trust_checkpoint: true`` / ``--trust-checkpoint``).
"""

from __future__ import annotations

import argparse
import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)


class UntrustedCheckpoint(ValueError):
    """A checkpoint pickles objects outside the allowlist and the user did not opt in."""


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def allowed_globals() -> list[Any]:
    """argparse.Namespace, numpy scalars / dtypes / arrays: data only, nothing that runs code."""
    multiarray = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    out: list[Any] = [argparse.Namespace, np.dtype, np.ndarray, multiarray.multiarray.scalar,
                      multiarray.multiarray._reconstruct]
    out += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return out


def _allowed_names() -> set[str]:
    names = set()
    for obj in allowed_globals():
        names.add(_qualname(obj))
        names.add(f"{obj.__module__.replace('numpy._core', 'numpy.core')}.{obj.__qualname__}")
    return names


def load_checkpoint_file(path: str | Path, trust: bool = False) -> Any:
    """``torch.load`` a pickle checkpoint with only tensors and the allowlisted types; with ``trust``
    anything (full unpickling, logged)."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust:
            try:
                found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            except Exception:  # noqa: BLE001 - naming the types is best effort; the refusal is not
                found = []
            names = [n for n in found if n not in _allowed_names()] or [str(e).strip().splitlines()[-1][:200]]
            raise UntrustedCheckpoint(
                f"checkpoint {path} pickles Python objects that are not weights ({', '.join(names)}); unpickling "
                "them could run code, so it is refused. If you trust the file, set model.trust_checkpoint: true "
                "(or --trust-checkpoint)") from None
    logger.warning("%s: trusted checkpoint loaded with full unpickling (weights_only=False)", path)
    return torch.load(path, map_location="cpu", weights_only=False)

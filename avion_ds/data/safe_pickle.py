"""Read annotation pickles (Ego4D narrations, EPIC-100 MIR relevancy) without running code from them.

``pickle.load`` calls whatever global a file names: a downloaded ``ego4d_train.pkl`` could run
``os.system``. :func:`load_pickle` resolves only the globals that plain data needs: Python's
containers and scalars, ``collections.OrderedDict``, and numpy's array / scalar / dtype
reconstruction (the names numpy 1.x and 2.x write, for every pickle protocol: ``_reconstruct``,
``_frombuffer``, ``scalar``, ``ndarray``, ``dtype``, and ``_codecs.encode`` limited to latin-1, which
protocol 2 uses for bytes). Any other global raises :class:`UnsafePickle` naming the file and the
global; a truncated file or one that is not a pickle raises :class:`UnreadablePickle`. Both are
``ValueError`` with a one-line message.
"""

from __future__ import annotations

import builtins
import codecs
import collections
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np

_BUILTINS = ("list", "dict", "tuple", "set", "frozenset", "str", "bytes", "int", "float", "complex", "bool")
_LATIN1 = ("latin1", "latin-1", "latin_1", "iso-8859-1", "iso8859-1", "l1")


class UnsafePickle(ValueError):
    """A pickle naming a global outside the data allowlist (it could run code when unpickled)."""


class UnreadablePickle(ValueError):
    """A file that is not a complete pickle (truncated, empty, another format)."""


def _numpy_core() -> tuple[Any, Any]:
    """numpy's ``multiarray`` and ``numeric`` modules (``numpy._core`` in 2.x, ``numpy.core`` in 1.x)."""
    try:
        from numpy._core import multiarray, numeric  # lazy: numpy 2.x's name; which one exists depends on the numpy
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray, numeric  # lazy: numpy 1.x's name
    return multiarray, numeric


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes (latin-1 only)."""
    if not isinstance(text, str) or str(encoding).lower() not in _LATIN1:
        raise pickle.UnpicklingError(f"_codecs.encode is allowed only for latin-1 text, got {encoding!r}")
    return codecs.encode(text, "latin1", errors)


def _allowed() -> dict[tuple[str, str], Any]:
    """(module, name) -> object, for every global :func:`load_pickle` resolves."""
    multiarray, numeric = _numpy_core()
    out: dict[tuple[str, str], Any] = {}
    for module in ("builtins", "__builtin__"):  # protocol < 3 writes Python 2's module name
        out.update({(module, name): getattr(builtins, name) for name in _BUILTINS})
    out[("collections", "OrderedDict")] = collections.OrderedDict
    out[("_codecs", "encode")] = _latin1_encode
    out[("numpy", "ndarray")] = np.ndarray
    out[("numpy", "dtype")] = np.dtype
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        out[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        if hasattr(numeric, "_frombuffer"):
            out[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    return out


class _DataUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` only knows the data allowlist."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path
        self.allowed = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise UnsafePickle(
                f"{self.path}: refused to unpickle global {module}.{name}: annotation and relevancy pickles "
                "hold only lists, tuples, strings, numbers and numpy arrays, and are never allowed to run code"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle(f"{self.path}: refused a persistent id {pid!r} (annotation pickles hold plain data)")


def load_pickle(path: str | Path) -> Any:
    """The object pickled in ``path``, resolving only plain-data globals (see module doc)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pickle file not found: {path}")
    with path.open("rb") as f:
        try:
            return _DataUnpickler(f, path).load()
        except UnsafePickle:
            raise
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            IndexError,
            KeyError,
            AttributeError,
            struct.error,
            UnicodeDecodeError,
        ) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UnreadablePickle(
                f"{path}: not a readable pickle (truncated, or another format): {type(e).__name__}: {reason}"
            ) from None

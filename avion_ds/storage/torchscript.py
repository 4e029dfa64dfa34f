"""The state dict inside a TorchScript archive (OpenAI's released CLIP files), read without running it.

``torch.jit.load`` compiles and runs the archive's ``code/`` to rebuild the module, and
``torch.load(weights_only=True)`` refuses TorchScript archives. Neither is needed for the weights:
the archive is a zip whose ``<root>/data.pkl`` pickles the module tree (each module an instance of
a ``__torch__.*`` class with its attributes as a dict) and whose ``<root>/data/<key>`` entries hold
the raw tensor storages. A restricted unpickler reads that pickle with a stand-in for every
``__torch__`` class (it only stores the attribute dict), the standard tensor rebuild and
``OrderedDict`` (and ``torch.jit._pickle``'s list builders, which return their argument); any
other global is refused, so nothing in the file can run. The tensors found
walking the tree are the module's ``state_dict`` (the same names, values and dtypes).
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError
from avion_ds.storage.safe_load import UntrustedCheckpoint

_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "DoubleStorage": torch.float64,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


def _same(data: Any, *_: Any) -> Any:
    """``torch.jit._pickle``'s list builders and type-tag restorer: return their data unchanged."""
    return data


_JIT_PICKLE = {"build_intlist", "build_tensorlist", "build_doublelist", "build_boollist", "restore_type_tag"}


class ScriptObject:
    """Stand-in for a pickled ``__torch__`` class instance: keeps its attribute dict, runs nothing."""

    def __init__(self, *args: Any) -> None:
        self.attrs: dict[str, Any] = {}

    def __setstate__(self, state: Any) -> None:
        self.attrs = state if isinstance(state, dict) else {}


class _StorageType:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


def _rebuild_tensor(storage: torch.Tensor, offset: int, size: Any, stride: Any, *_: Any) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` on a flat tensor standing for the storage."""
    return storage.as_strided(tuple(size), tuple(stride), offset).clone()


def _shape_only(storage: torch.Tensor, _offset: int, size: Any, *_: Any) -> torch.Tensor:
    """The tensor's shape and dtype on the meta device: no storage was read."""
    return torch.empty(tuple(size), dtype=storage.dtype, device="meta")


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, root: str, path: Path, scan: bool = False) -> None:
        super().__init__(io.BytesIO(data))
        self.archive, self.root, self.path, self.scan = archive, root, path, scan
        self.classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            return self.classes.setdefault(f"{module}.{name}", type(name, (ScriptObject,), {}))
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _shape_only if self.scan else _rebuild_tensor
        if module == "torch.jit._pickle" and name in _JIT_PICKLE:
            return _same
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        raise UntrustedCheckpoint(
            f"TorchScript archive {self.path} pickles {module}.{name}, which is neither a module nor a "
            f"tensor; refused (nothing was run). --trust-checkpoint does not apply to TorchScript archives: "
            f"load it with torch.jit.load yourself only if you trust the file"
        )

    def persistent_load(self, pid: Any) -> torch.Tensor:
        try:
            kind, storage_type, key, _location, numel = pid
        except (TypeError, ValueError):
            kind = storage_type = None
        if kind != "storage" or not isinstance(storage_type, _StorageType):
            raise UntrustedCheckpoint(f"TorchScript archive {self.path}: unexpected persistent id {str(pid)[:80]}")
        if self.scan:  # types only: no storage read
            return torch.empty(0, dtype=storage_type.dtype)
        raw = self.archive.read(f"{self.root}data/{key}")
        if not numel:
            return torch.empty(0, dtype=storage_type.dtype)
        return torch.frombuffer(bytearray(raw), dtype=storage_type.dtype)[:numel]


def torchscript_root(path: str | Path) -> str | None:
    """The archive's top folder (``"name/"``) when ``path`` is a TorchScript zip, else None."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):  # a damaged zip: the checkpoint reader names it
        return None
    roots = [n[: -len("data.pkl")] for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    for root in roots:
        if f"{root}constants.pkl" in names or any(n.startswith(f"{root}code/") for n in names):
            return root
    return None


def _collect(obj: Any, prefix: str, out: dict[str, torch.Tensor], seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for name, value in obj.attrs.items():
        if isinstance(value, torch.Tensor):
            out[prefix + name] = value
        elif isinstance(value, ScriptObject):
            _collect(value, f"{prefix}{name}.", out, seen)


def _other_pickles(archive: zipfile.ZipFile, root: str) -> list[str]:
    """The archive's pickles besides ``data.pkl`` (``constants.pkl``, ``code/*.debug_pkl``): torch.jit.load
    would unpickle them, so they pass the same restricted unpickler before anything else is read."""
    return [n for n in archive.namelist() if n.startswith(root) and n.endswith("pkl") and n != f"{root}data.pkl"]


def _module_tree(path: Path, scan: bool) -> ScriptObject:
    """The archive's module tree from its ``data.pkl`` (``scan``: types only, no tensor data read);
    ``UntrustedCheckpoint`` for a global we do not allow, ``ConfigError`` (one line) for a truncated or
    corrupt archive."""
    root = torchscript_root(path)
    if root is None:
        raise ValueError(f"{path} is not a TorchScript archive (no <root>/data.pkl with code/ or constants.pkl)")
    try:
        with zipfile.ZipFile(path) as z:
            for other in _other_pickles(z, root):  # constants.pkl: read by the same rules, kept nowhere
                _Unpickler(z.read(other), z, root, path, scan=True).load()
            top = _Unpickler(z.read(f"{root}data.pkl"), z, root, path, scan).load()
    except UntrustedCheckpoint:
        raise
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, KeyError, ValueError, TypeError, RuntimeError) as e:
        why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise ConfigError(
            f"TorchScript archive {path} is truncated or corrupt ({type(e).__name__}: {why}); nothing was run"
        ) from None
    if not isinstance(top, ScriptObject):
        raise ConfigError(f"TorchScript archive {path}: data.pkl holds a {type(top).__name__}, not a module")
    return top


def check_torchscript(path: str | Path) -> None:
    """Refuse, before any work starts, an archive :func:`read_torchscript_state_dict` would refuse: its
    ``data.pkl`` is read by the same restricted unpickler, without reading a tensor."""
    _module_tree(Path(path), scan=True)


def torchscript_shapes(path: str | Path) -> dict[str, torch.Tensor]:
    """The archive's state dict with shape-only tensors (meta device): what start-up fits to the model."""
    out: dict[str, torch.Tensor] = {}
    _collect(_module_tree(Path(path), scan=True), "", out, set())
    return out


def read_torchscript_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a TorchScript module archive by their ``state_dict`` names (nothing executed)."""
    out: dict[str, torch.Tensor] = {}
    _collect(_module_tree(Path(path), scan=False), "", out, set())
    return out

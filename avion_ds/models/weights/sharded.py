"""Pretrained weights into a ZeRO-3 partitioned model, one submodule at a time.

Rank 0 reads the checkpoint and maps / resizes it with ``checkpoint.prepare_state_dict`` (same
formats, key mapping, position-embedding resizing and ``LoadReport`` as a plain model's load;
``loading.load_weights`` sends a partitioned model here). A
.safetensors file that needs no conversion (our exports, same-size models) is mapped on its
header alone and read one tensor at a time, so rank 0 never holds the whole checkpoint either.
Then every rank walks the modules in the same order: a module's own parameters are gathered,
rank 0 copies its tensors in, and leaving the context broadcasts and re-partitions them. Peak
host memory: one checkpoint copy on rank 0 (entries are dropped as they are copied) and one
submodule's full parameters elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from avion_ds.distributed.dist import broadcast_object, rank
from avion_ds.models.partition import full_shape, gathered
from avion_ds.models.weights.checkpoint import prepare_state_dict, take_declared_mean_std
from avion_ds.models.weights.report import LoadReport
from avion_ds.storage.safetensors_stream import SafetensorsReader


class _LazyStateDict:
    """The part of a dict ``_copy_partitioned`` uses, reading each tensor from the file on ``pop``."""

    def __init__(self, names: dict[str, str], reader: SafetensorsReader) -> None:
        self.names, self.reader = names, reader

    def pop(self, key: str, default: Any = None) -> Any:
        src = self.names.pop(key, None)
        return default if src is None else self.reader.get(src)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.names))


def _prepare_lazy(
    model: nn.Module, source: Any, kinetics_head: bool = False
) -> tuple[_LazyStateDict, LoadReport] | None:
    """For a .safetensors file whose tensors load as stored (no key merging / resizing): the
    mapping and report computed on shape-only tensors, values read one at a time. Else None."""
    if not isinstance(source, (str, Path)) or Path(source).suffix != ".safetensors" or not Path(source).is_file():
        return None
    reader = SafetensorsReader(source)
    meta = reader.meta()
    origin = {id(v): k for k, v in meta.items()}
    sd, report = prepare_state_dict(model, meta, kinetics_head=kinetics_head)
    if any(id(v) not in origin for v in sd.values()):
        return None  # something was converted: needs the values (one full read on rank 0)
    take_declared_mean_std(report, source)  # read from the header alone: what the files beside it state
    return _LazyStateDict({k: origin[id(v)] for k, v in sd.items()}, reader), report


def _copy_partitioned(model: nn.Module, sd: Any) -> list[str]:
    """Walk ``model`` module by module (all ranks); rank 0 (``sd`` not None) copies and pops what
    it used. Returns the model names the checkpoint lacked (rank 0)."""
    missing: list[str] = []

    def take(key: str, target: torch.Tensor, shape: torch.Size) -> None:
        value = sd.pop(key, None) if sd is not None else None
        if value is not None:
            target.copy_(value.reshape(shape).to(target.dtype))
        elif sd is not None:
            missing.append(key)

    for prefix, module in model.named_modules():
        pre = f"{prefix}." if prefix else ""
        params = list(module.named_parameters(recurse=False))
        if params:
            with gathered([p for _, p in params], modifier_rank=0), torch.no_grad():
                for name, p in params:
                    take(pre + name, p.data, full_shape(p))
        for name, buf in module.named_buffers(recurse=False):
            if name in module._non_persistent_buffers_set:
                continue
            take(pre + name, buf, buf.shape)
            if tdist.is_available() and tdist.is_initialized():
                tdist.broadcast(buf, src=0)
    return missing


def load_partitioned(
    model: nn.Module, source: str | Path | dict, trust: bool = False, *, kinetics_head: bool = False
) -> LoadReport:
    """Fill the ZeRO-3 partitioned ``model`` from ``source``; the report (``missing`` / ``unexpected`` as
    the copy found them) on every rank. Collective: every rank of the model's process group calls it; only
    rank 0 reads ``source``. A read or mapping error is raised on every rank (nobody hangs)."""
    sd, report, error = None, None, None
    if rank() == 0:
        try:
            lazy = _prepare_lazy(model, source, kinetics_head)
            sd, report = (
                lazy if lazy is not None else prepare_state_dict(model, source, trust, kinetics_head=kinetics_head)
            )
        except Exception as e:  # noqa: BLE001 - every rank raises the same one-line error, nobody hangs
            error = (type(e), str(e))
    error = broadcast_object(error)
    if error is not None:
        try:
            exc = error[0](error[1])
        except Exception:  # noqa: BLE001 - an exception type that cannot be rebuilt from its text
            exc = RuntimeError(error[1])
        raise exc
    missing = _copy_partitioned(model, sd)
    if sd is not None:
        report.missing, report.unexpected = missing, list(sd)  # sd now holds only what was not used
    return broadcast_object(report)

"""Tensor-at-a-time safetensors reading and writing (no mmap, no whole-file copy in memory).

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets; optional ``__metadata__``) and the raw bytes. ``SafetensorsReader`` reads one
tensor per call with ``readinto`` (nothing file-backed stays mapped in the process), and
``SafetensorsWriter`` writes a file whose header is known up front tensor by tensor, so a
consolidating export never holds more than one tensor. Files are standard safetensors:
``safetensors.torch.load_file`` and ``create_model(..., pretrained=file)`` read them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


class SafetensorsReader:
    """Header of a safetensors file; ``meta()`` gives shape-only (meta) tensors, ``get`` reads one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self.entries: dict[str, dict[str, Any]] = header
        self.data_start = 8 + n

    def keys(self) -> list[str]:
        return list(self.entries)

    def meta(self) -> dict[str, torch.Tensor]:
        """name -> empty tensor of the right dtype and shape on the meta device."""
        return {k: torch.empty(e["shape"], dtype=DTYPES[e["dtype"]], device="meta") for k, e in self.entries.items()}

    def get(self, name: str) -> torch.Tensor:
        e = self.entries[name]
        start, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        if end == start:
            return torch.zeros(e["shape"], dtype=dtype)
        # frombuffer, not torch.empty: safe inside zero.Init, which patches the tensor constructors
        buf = bytearray(end - start)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + start)
            if f.readinto(buf) != end - start:
                raise ValueError(f"{self.path}: tensor {name} is truncated")
        return torch.frombuffer(buf, dtype=dtype).reshape(e["shape"])


class SafetensorsWriter:
    """Write a safetensors file from a known list of (name, dtype, shape), one tensor at a time,
    in that order. Written to ``path.tmp`` and renamed by ``close()``: a crash leaves no half file."""

    def __init__(
        self,
        path: str | Path,
        specs: list[tuple[str, torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        header: dict[str, Any] = {}
        offset = 0
        for name, dtype, shape in specs:
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        if metadata:
            header = {"__metadata__": dict(metadata), **header}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # data aligned to 8 bytes, as the reference writer does
        self.order = [name for name, _, _ in specs]
        self.specs = {name: (dtype, tuple(shape)) for name, dtype, shape in specs}
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.file = open(self.tmp, "wb")  # noqa: SIM115 - written across calls, closed by close()
        self.file.write(struct.pack("<Q", len(blob)) + blob)
        self.next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self.next >= len(self.order) or self.order[self.next] != name:
            want = self.order[self.next] if self.next < len(self.order) else "nothing"
            raise ValueError(f"safetensors writer: expected {want}, got {name}")
        dtype, shape = self.specs[name]
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise ValueError(
                f"safetensors writer: {name} is {tensor.dtype} {tuple(tensor.shape)}, header says {dtype} {shape}"
            )
        t = tensor.detach().cpu().contiguous()
        if t.numel():
            self.file.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        self.next += 1

    def close(self) -> Path:
        if self.next != len(self.order):
            self.file.close()
            raise ValueError(f"safetensors writer: {len(self.order) - self.next} tensors not written")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.path

"""Decoder base class, backend registry and the helpers every backend shares.

A backend subclasses :class:`Decoder` and implements ``_decode(path, sorted_unique_indices, crop)``;
the base class validates the request, turns library errors into one :class:`DataError` line naming
the file, applies the crop when the backend could not fuse it, and restores the requested order
(duplicates allowed). Backends live in ``decode_<backend>.py``; :mod:`avion_ds.data.decode.select`
registers them and picks one (``get_decoder``).
"""

from __future__ import annotations

import importlib
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from avion_ds.data.crop import CropBox, CropSpec, crop_resize
from avion_ds.data.errors import DataError

if TYPE_CHECKING:
    import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

# comma-separated modules that call register_backend(): the user's own environment (like --plugin), which
# decode helper processes and loader workers inherit; never set from a recipe, run directory or index
PLUGINS_ENV = "AVION_DS_DECODER_PLUGINS"


class DecoderUnavailable(ImportError):
    """The selected decoder backend cannot be imported here."""


REGISTRY: dict[str, type[Decoder]] = {}


def register_backend(name: str, cls: type[Decoder]) -> None:
    """Add a backend under ``name`` (plugins listed in $AVION_DS_DECODER_PLUGINS also load in helpers)."""
    REGISTRY[name] = cls


def load_plugins() -> None:
    """Import the plugin modules named in $AVION_DS_DECODER_PLUGINS (they register backends)."""
    for mod in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        importlib.import_module(mod)


@dataclass(frozen=True)
class MemoryVideo:
    """A video file held in memory (a chunk read from a shard): every backend decodes it from its bytes,
    without a temporary file; ``name`` (shard location, video, chunk) is what error messages say."""

    name: str
    data: bytes

    def __str__(self) -> str:
        return self.name


Source = str | Path | MemoryVideo  # what a decoder reads: a file, or a file's bytes in memory


def file_like(src: Source) -> str | io.BytesIO:
    """What decord / PyAV open: the path, or a file object over a :class:`MemoryVideo`'s bytes."""
    return io.BytesIO(src.data) if isinstance(src, MemoryVideo) else str(src)


def reason(e: BaseException) -> str:
    """``Type: first line`` of an exception, capped (for one-line error messages)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def require(backend: str, module: str, install_hint: str) -> None:
    """Import ``module`` or raise DecoderUnavailable naming the backend, the reason and the fix."""
    try:
        importlib.import_module(module)
    except Exception as e:  # torchcodec raises RuntimeError when the FFmpeg libraries are missing
        raise DecoderUnavailable(f"decoder {backend!r} is not available ({reason(e)}); {install_hint}") from e


def check_frame_indices(path: Source, indices: Sequence[int]) -> tuple[str | MemoryVideo, list[int], list[int]]:
    """(path, requested indices, sorted unique indices); DataError for a missing / empty file."""
    path = path if isinstance(path, MemoryVideo) else str(path)
    idx = [int(i) for i in indices]
    if not idx:
        raise ValueError("decode() needs at least one frame index")
    if isinstance(path, MemoryVideo):
        if not path.data:
            raise DataError(f"{path}: zero-byte file")
    elif not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    elif os.path.getsize(path) == 0:
        raise DataError(f"{path}: zero-byte file")
    if min(idx) < 0:
        raise DataError(f"{path}: negative frame index {min(idx)}")
    return path, idx, sorted(set(idx))


def finish(frames, done: bool, crop: CropSpec | None, uniq: list[int], idx: list[int]) -> torch.Tensor:
    """To torch, apply the crop if the backend could not, and expand to the requested order."""
    import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

    frames = torch.from_numpy(frames) if isinstance(frames, np.ndarray) else frames
    if crop is not None and not done:
        h, w = frames.shape[1:3]
        frames = crop_resize(frames, crop.for_frame(h, w), crop.out_size(h, w))
    if uniq != idx:
        pos = {v: i for i, v in enumerate(uniq)}
        frames = frames[torch.tensor([pos[i] for i in idx])]
    return frames


class Decoder:
    """Base class: validation, error wording, de-duplication and re-ordering around ``_decode``.

    A backend's ``_decode(path, sorted_unique_indices, crop)`` returns ``(frames, done)``: numpy
    or torch uint8 (N, h, w, C), and whether the crop was already applied (fused) or still has
    to be applied to the uint8 frames. ``exact=False`` lets a backend locate frames by timestamp
    (index / fps) instead of scanning the file first: exact for chunks written by ``avion-ds chunk``
    (constant frame rate, pts = frame number), which is what the datasets read when ``chunked``.
    """

    name = "base"
    alloc: Callable[[tuple[int, ...]], torch.Tensor | None] | None = None  # see __init__

    def __init__(self, threads: int = 1, fuse: bool = True, exact: bool = True) -> None:
        self.threads = max(1, int(threads))
        self.fuse = fuse
        self.exact = exact
        # where the fused crop's frames go: ``alloc(shape) -> uint8 tensor | None`` (None: a new tensor). The
        # timeout helper points it at its shared mapping, so the frames are written there once, in place.
        self.alloc: Callable[[tuple[int, ...]], torch.Tensor | None] | None = None
        self.check_available()

    @classmethod
    def check_available(cls) -> None:
        """Import the backend's library or raise DecoderUnavailable."""

    def decode(self, path: Source, indices: Sequence[int], crop: CropSpec | None = None) -> torch.Tensor:
        """Frames ``indices`` of ``path`` (a file or a :class:`MemoryVideo`; cropped/resized per ``crop``) as
        uint8 (T, H, W, C)."""
        path, idx, uniq = check_frame_indices(path, indices)
        frames, done = self.decode_raw(path, uniq, crop)
        return finish(frames, done, crop, uniq, idx)

    def decode_raw(self, path: str | MemoryVideo, uniq: list[int], crop: CropSpec | None):
        """``_decode`` with every library error turned into one DataError line naming the file."""
        try:
            frames, done = self._decode(path, uniq, crop)
        except DataError:
            raise
        except Exception as e:  # any library error on a bad file becomes one DataError line
            raise DataError(f"{path}: {self.name} could not decode frames {uniq[0]}..{uniq[-1]} ({reason(e)})") from e
        if frames.shape[0] != len(uniq):
            raise DataError(f"{path}: {self.name} decoded {frames.shape[0]} of {len(uniq)} requested frames")
        return frames, done

    def _decode(self, path: str | MemoryVideo, indices: list[int], crop: CropSpec | None):
        raise NotImplementedError

    def _crop_resize(self, frames: torch.Tensor, box: CropBox | None, size: tuple[int, int] | None) -> torch.Tensor:
        """:func:`crop_resize` into ``self.alloc``'s buffer when one is set (the fused crop's last step)."""
        t, h, w, c = frames.shape
        if box is not None:
            h, w = box.height, box.width
        shape = (t, *(size or (h, w)), c)
        out = self.alloc(shape) if self.alloc is not None and frames.device.type == "cpu" else None
        return crop_resize(frames, box, size, out=out)

    @staticmethod
    def _too_few(path: str, have: int, want: int) -> DataError:
        return DataError(
            f"{path}: only {have} decodable frames, asked for frame {want} (file shorter than its manifest?)"
        )

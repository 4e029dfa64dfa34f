"""Video decoder backends behind one interface: ``decode(path, indices, crop) -> uint8 (T, H, W, C)``.

* ``decord`` (default): accurate ``get_batch`` on sorted unique indices; the crop is fused as a
  decode-time resize (the frame is scaled so the crop box lands at the output size, then the
  box is sliced) unless that would blow the frame up more than 2x in area (tiny crops), in which
  case it crops + resizes the uint8 frames after decoding. decord 0.6 fails to resize to a few
  output widths (16, 24, 48, 72 px measured); those reads fall back to crop-after-decode too.
* ``torchcodec``: decoder-native transforms — a crop at a CHOSEN position through the private
  ``DecoderTransform._make_transform_spec`` hook ("crop, h, w, left, top") followed by the public
  ``Resize``. The hook is private: if torchcodec rejects it, the backend logs one warning and
  falls back to decode + crop/resize on the uint8 frames.
* ``pyav``: seek to the keyframe before the first wanted frame, decode forward, and run each
  wanted frame through an FFmpeg filter graph ``crop -> scale (bilinear) -> rgb24``.

Every backend uses ``threads`` decoder threads (1 per DataLoader worker by default), returns
torch uint8 frames in the order of ``indices`` (duplicates allowed) and raises
:class:`DataError` naming the file for missing / empty / corrupt files and for indices past the
last decodable frame. Selecting a backend that cannot import raises
:class:`DecoderUnavailable` saying how to install it; the others keep working.

Timeouts: decord can spin forever on a container that over-reports frames (decord #373) while
holding the GIL, so a thread cannot bound it. With ``timeout_s > 0`` :func:`get_decoder` returns
a :class:`SubprocessDecoder`: the backend runs in one persistent helper process per
DataLoader worker (started lazily, frames returned over a pipe; its cost is in BENCHMARKS.md); a
decode that exceeds the limit kills the helper (a fresh one starts on the next call) and raises
:class:`DataError`. A crash (segfault) inside the decoder becomes a DataError the same way
instead of killing the DataLoader worker. ``timeout_s = 0`` decodes in-process.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .crop import CropBox, CropSpec, crop_resize
from .errors import DataError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
PLUGINS_ENV = "AVION_DS_DECODER_PLUGINS"  # comma-separated modules that call register_backend()
_STARTUP_LIMIT_S = 120.0  # a helper process must be importable and ready within this


class DecoderUnavailable(ImportError):
    """The selected decoder backend cannot be imported here."""


_REGISTRY: dict[str, type[Decoder]] = {}


def register_backend(name: str, cls: type[Decoder]) -> None:
    """Add a backend under ``name`` (plugins listed in $AVION_DS_DECODER_PLUGINS also load in helpers)."""
    _REGISTRY[name] = cls


def _load_plugins() -> None:
    for mod in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        importlib.import_module(mod)


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _require(backend: str, module: str, install_hint: str) -> None:
    """Import ``module`` or raise DecoderUnavailable naming the backend, the reason and the fix."""
    try:
        importlib.import_module(module)
    except Exception as e:  # torchcodec raises RuntimeError when the FFmpeg libraries are missing
        raise DecoderUnavailable(f"decoder {backend!r} is not available ({_reason(e)}); {install_hint}") from e


def _validate(path: str | Path, indices: Sequence[int]) -> tuple[str, list[int], list[int]]:
    path = str(path)
    idx = [int(i) for i in indices]
    if not idx:
        raise ValueError("decode() needs at least one frame index")
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    if os.path.getsize(path) == 0:
        raise DataError(f"{path}: zero-byte file")
    if min(idx) < 0:
        raise DataError(f"{path}: negative frame index {min(idx)}")
    return path, idx, sorted(set(idx))


def _finish(frames, done: bool, crop: CropSpec | None, uniq: list[int], idx: list[int]) -> torch.Tensor:
    """To torch, apply the crop if the backend could not, and expand to the requested order."""
    import torch

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
    to be applied to the uint8 frames.
    """

    name = "base"

    def __init__(self, threads: int = 1, fuse: bool = True) -> None:
        self.threads = max(1, int(threads))
        self.fuse = fuse
        self.check_available()

    @classmethod
    def check_available(cls) -> None:
        """Import the backend's library or raise DecoderUnavailable."""

    def decode(self, path: str | Path, indices: Sequence[int], crop: CropSpec | None = None) -> torch.Tensor:
        """Frames ``indices`` of ``path`` (cropped/resized per ``crop``) as uint8 (T, H, W, C)."""
        path, idx, uniq = _validate(path, indices)
        frames, done = self.decode_raw(path, uniq, crop)
        return _finish(frames, done, crop, uniq, idx)

    def decode_raw(self, path: str, uniq: list[int], crop: CropSpec | None):
        """``_decode`` with every library error turned into one DataError line naming the file."""
        try:
            frames, done = self._decode(path, uniq, crop)
        except DataError:
            raise
        except Exception as e:  # any library error on a bad file becomes one DataError line
            raise DataError(f"{path}: {self.name} could not decode frames {uniq[0]}..{uniq[-1]} ({_reason(e)})") from e
        if frames.shape[0] != len(uniq):
            raise DataError(f"{path}: {self.name} decoded {frames.shape[0]} of {len(uniq)} requested frames")
        return frames, done

    def _decode(self, path: str, indices: list[int], crop: CropSpec | None):
        raise NotImplementedError

    @staticmethod
    def _too_few(path: str, have: int, want: int) -> DataError:
        return DataError(f"{path}: only {have} decodable frames, asked for frame {want} (file shorter than its manifest?)")


class DecordDecoder(Decoder):
    """decord VideoReader + accurate get_batch; crop fused as decode-time resize when cheap."""

    name = "decord"

    @classmethod
    def check_available(cls) -> None:
        _require("decord", "decord", "pip install decord")

    def _decode(self, path: str, indices: list[int], crop: CropSpec | None):
        import decord

        kw: dict[str, int] = {}
        sliced: CropBox | None = None
        if crop is not None and self.fuse and crop.size is not None:
            box = crop.for_frame(crop.frame_h, crop.frame_w)
            oh, ow = crop.size
            sy, sx = oh / box.height, ow / box.width
            h2, w2 = int(round(crop.frame_h * sy)), int(round(crop.frame_w * sx))
            if h2 * w2 <= 2 * crop.frame_h * crop.frame_w:
                kw = {"height": h2, "width": w2}
                b = box.scaled(sy, sx, h2, w2)
                sliced = CropBox(min(b.top, h2 - oh), min(b.left, w2 - ow), oh, ow)
        if kw:
            try:
                frames = self._read(decord, path, indices, kw)
            except DataError:
                raise
            except Exception:  # noqa: BLE001 - decord 0.6 fails for some output widths (16, 24, 48, 72 px)
                frames = None
            if frames is not None and frames.shape[1:3] == (kw["height"], kw["width"]):
                b = sliced
                return np.ascontiguousarray(frames[:, b.top:b.top + b.height, b.left:b.left + b.width]), True
        return self._read(decord, path, indices, {}), crop is None

    def _read(self, decord, path: str, indices: list[int], kw: dict[str, int]) -> np.ndarray:
        vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=self.threads, **kw)
        n = len(vr)
        if indices[-1] >= n:
            raise self._too_few(path, n, indices[-1])
        return vr.get_batch(indices).asnumpy()


class _CropAt:
    """torchcodec decoder transform: crop at a chosen (top, left) via the private spec hook."""

    def __new__(cls, box: CropBox):  # built lazily so the module imports without torchcodec
        from torchcodec.transforms import DecoderTransform

        class CropAt(DecoderTransform):
            def __init__(self, b: CropBox) -> None:
                self.box = b

            def _make_transform_spec(self, input_dims: tuple[int | None, int | None]) -> str:
                b = self.box
                return f"crop, {b.height}, {b.width}, {b.left}, {b.top}"

            def _get_output_dims(self) -> tuple[int | None, int | None] | None:
                return (self.box.height, self.box.width)

        return CropAt(box)


class TorchCodecDecoder(Decoder):
    """torchcodec VideoDecoder with decoder-native crop (private hook) + Resize; falls back if rejected."""

    name = "torchcodec"

    def __init__(self, threads: int = 1, fuse: bool = True) -> None:
        super().__init__(threads, fuse)
        self.hook_ok: bool | None = None  # None: untested, False: fell back

    @classmethod
    def check_available(cls) -> None:
        _require("torchcodec", "torchcodec.decoders", "pip install torchcodec and install FFmpeg shared "
                 "libraries (Debian/Ubuntu: apt-get install ffmpeg)")

    def _open(self, path: str, transforms: list | None):
        from torchcodec.decoders import VideoDecoder

        return VideoDecoder(path, dimension_order="NHWC", num_ffmpeg_threads=self.threads, seek_mode="exact",
                            transforms=transforms)

    def _decode(self, path: str, indices: list[int], crop: CropSpec | None):
        dec, fused = None, False
        if crop is not None and self.fuse and self.hook_ok is not False:
            from torchcodec.transforms import Resize

            box = crop.for_frame(crop.frame_h, crop.frame_w)
            try:
                transforms = [_CropAt(box)] + ([Resize(list(crop.size))] if crop.size else [])
                dec, fused = self._open(path, transforms), True
            except Exception as e:  # noqa: BLE001 - a newer torchcodec may reject the private hook
                plain = self._open(path, None)  # raises for a bad file: then it was not the hook
                if self.hook_ok is None:
                    log.warning("torchcodec rejected the crop-at-position hook (%s); cropping after decode instead",
                                _reason(e))
                self.hook_ok, dec = False, plain
            else:
                self.hook_ok = True
        if dec is None:
            dec = self._open(path, None)
        n = dec.metadata.num_frames
        if n is not None and indices[-1] >= n:
            raise self._too_few(path, n, indices[-1])
        return dec.get_frames_at(indices).data, fused or crop is None


class PyAVDecoder(Decoder):
    """PyAV: keyframe seek + forward decode; crop + scale in an FFmpeg filter graph per frame."""

    name = "pyav"

    @classmethod
    def check_available(cls) -> None:
        _require("pyav", "av", "pip install av")

    def _graph(self, stream, crop: CropSpec):
        import av.filter

        h, w = stream.codec_context.height, stream.codec_context.width
        box, (oh, ow) = crop.for_frame(h, w), crop.out_size(h, w)
        g = av.filter.Graph()
        nodes = [g.add_buffer(template=stream), g.add("crop", f"{box.width}:{box.height}:{box.left}:{box.top}")]
        if (oh, ow) != (box.height, box.width):
            nodes.append(g.add("scale", f"{ow}:{oh}:flags=bilinear"))
        nodes += [g.add("format", "pix_fmts=rgb24"), g.add("buffersink")]
        for a, b in pairwise(nodes):
            a.link_to(b)
        g.configure()
        return g

    def _decode(self, path: str, indices: list[int], crop: CropSpec | None):
        import av

        want = set(indices)
        out: dict[int, np.ndarray] = {}
        with av.open(path) as c:
            if not c.streams.video:
                raise DataError(f"{path}: no video stream")
            s = c.streams.video[0]
            s.thread_count = self.threads
            fps = s.average_rate or s.guessed_rate
            tb, t0 = s.time_base, s.start_time or 0
            graph = self._graph(s, crop) if crop is not None and self.fuse else None
            use_pts = fps is not None and tb is not None
            if use_pts and indices[0] > 0:
                c.seek(int(t0 + indices[0] / fps / tb), stream=s, backward=True, any_frame=False)
            count, last = 0, -1
            for frame in c.decode(s):
                if use_pts and frame.pts is None:  # no timestamps: restart and count frames instead
                    return self._decode_counting(path, indices, crop)
                i = int(round((frame.pts - t0) * tb * fps)) if use_pts else count
                count, last = count + 1, i
                if i in want:
                    if graph is not None:
                        graph.push(frame)
                        out[i] = graph.pull().to_ndarray()
                    else:
                        out[i] = frame.to_ndarray(format="rgb24")
                if i >= indices[-1]:
                    break
        if len(out) != len(indices):
            missing = [i for i in indices if i not in out]
            raise DataError(f"{path}: decoding stopped at frame {last}, asked for frame {missing[0]} "
                            f"(file shorter than its manifest?)")
        return np.stack([out[i] for i in indices]), graph is not None or crop is None

    def _decode_counting(self, path: str, indices: list[int], crop: CropSpec | None):
        import av

        want, out = set(indices), {}
        with av.open(path) as c:
            s = c.streams.video[0]
            for i, frame in enumerate(c.decode(s)):
                if i in want:
                    out[i] = frame.to_ndarray(format="rgb24")
                if i >= indices[-1]:
                    break
        if len(out) != len(indices):
            raise self._too_few(path, len(out), indices[-1])
        return np.stack([out[i] for i in indices]), crop is None


register_backend("decord", DecordDecoder)
register_backend("torchcodec", TorchCodecDecoder)
register_backend("pyav", PyAVDecoder)
BACKENDS = ("decord", "torchcodec", "pyav")


# ----------------------------------------------------------------------------------------------
# timeout: the backend in a persistent helper process
# ----------------------------------------------------------------------------------------------
def _send(fd: int, obj: object) -> None:
    data = pickle.dumps(obj, protocol=5)
    os.write(fd, struct.pack("<Q", len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _recv_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """Read n bytes; None at EOF; TimeoutError past ``deadline`` (monotonic)."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd: int, deadline: float | None = None) -> object | None:
    head = _recv_exact(fd, 8, deadline)
    if head is None:
        return None
    body = _recv_exact(fd, struct.unpack("<Q", head)[0], deadline)
    return None if body is None else pickle.loads(body)


class SubprocessDecoder:
    """Runs backend ``name`` in a persistent child process so a hung or crashing decode is bounded."""

    def __init__(self, name: str, threads: int = 1, timeout_s: float = 60.0, fuse: bool = True) -> None:
        _REGISTRY[name].check_available()
        self.name, self.threads, self.timeout_s, self.fuse = name, threads, float(timeout_s), fuse
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()

    def _ensure(self) -> subprocess.Popen:
        if self._proc is not None and (self._pid != os.getpid() or self._proc.poll() is not None):
            self._proc = None  # forked copy or dead helper: start our own
        if self._proc is None:
            self._pid = os.getpid()
            cmd = [sys.executable, "-m", "avion_ds.data.decoders", self.name, str(self.threads), str(int(self.fuse))]
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
            try:  # the helper says "ready" once its imports are done; only then does the decode clock run
                ready = _recv(self._proc.stdout.fileno(), time.monotonic() + _STARTUP_LIMIT_S)
            except TimeoutError:
                ready = None
            if ready != "ready":
                self._kill()
                raise DataError(f"{self.name} decoder helper process did not start within {_STARTUP_LIMIT_S:g}s")
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def decode(self, path: str | Path, indices: Sequence[int], crop: CropSpec | None = None) -> torch.Tensor:
        path, idx, uniq = _validate(path, indices)
        proc = self._ensure()
        try:
            _send(proc.stdin.fileno(), (path, uniq, crop))
            reply = _recv(proc.stdout.fileno(), time.monotonic() + self.timeout_s)
        except TimeoutError:
            self._kill()
            raise DataError(f"{path}: {self.name} decode timed out after {self.timeout_s:g}s (helper process killed)") from None
        except (BrokenPipeError, OSError) as e:
            self._kill()
            raise DataError(f"{path}: {self.name} decoder process failed ({_reason(e)})") from None
        if reply is None:
            code = proc.wait()
            self._proc = None
            raise DataError(f"{path}: {self.name} decoder process died (exit code {code}) while decoding")
        kind, payload = reply
        if kind == "ok":
            return _finish(payload[0], payload[1], crop, uniq, idx)
        if kind == "data":
            raise DataError(payload)
        raise ValueError(payload)

    def close(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - the helper is already gone
                self._kill()
        self._proc = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - never raise from __del__
            pass

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_proc"] = None
        return state


def get_decoder(name: str = "decord", threads: int = 1, timeout_s: float = 0.0, fuse: bool = True) -> Decoder | SubprocessDecoder:
    """The backend ``name`` (decord | torchcodec | pyav); wrapped in a helper process when ``timeout_s > 0``."""
    _load_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown decoder {name!r} (choose from {', '.join(sorted(_REGISTRY))})")
    if timeout_s and timeout_s > 0:
        return SubprocessDecoder(name, threads, timeout_s, fuse)
    return _REGISTRY[name](threads, fuse)


def available_backends() -> list[str]:
    """Backends that import here."""
    ok = []
    for name in BACKENDS:
        try:
            _REGISTRY[name].check_available()
            ok.append(name)
        except DecoderUnavailable:
            pass
    return ok


def _serve(name: str, threads: int, fuse: bool) -> int:
    """Helper-process loop: framed pickled requests on stdin, replies on the original stdout."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints / library logs go to stderr, never into the reply stream
    in_fd = sys.stdin.fileno()
    _load_plugins()
    dec = _REGISTRY[name](threads, fuse)
    _send(out_fd, "ready")
    while True:
        req = _recv(in_fd)
        if req is None:
            return 0
        path, uniq, crop = req
        try:
            frames, done = dec.decode_raw(path, uniq, crop)
            reply = ("ok", (np.asarray(frames), done))
        except DataError as e:
            reply = ("data", str(e))
        except Exception as e:  # noqa: BLE001 - reported to the parent as one line
            reply = ("error", f"{path}: {_reason(e)}")
        _send(out_fd, reply)


if __name__ == "__main__":
    from avion_ds.data import decoders as _module  # noqa: PLW0406 - the importable module, where plugins register

    sys.exit(_module._serve(sys.argv[1], int(sys.argv[2]), bool(int(sys.argv[3]))))

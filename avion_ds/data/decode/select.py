"""Video decoder backends behind one interface: ``decode(path, indices, crop) -> uint8 (T, H, W, C)``.

* ``decord``: accurate ``get_batch``; crop fused as a decode-time resize (:mod:`.decode_decord`).
* ``torchcodec``: decoder-native crop + resize, timestamp seeking on chunks (:mod:`.decode_torchcodec`).
* ``torchcodec-cuda``: NVDEC decode + crop on the GPU; unavailable without CUDA (same module).
* ``pyav``: keyframe seek + FFmpeg filter graph per frame (:mod:`.decode_pyav`).
* ``auto`` (recipe default): :func:`pick_decoder` times every available backend on the first chunk
  of the dataset and takes the fastest; the choice is logged and recorded in the run directory
  (``decoder.json``) so a resumed run decodes with the same backend.

Every backend uses ``threads`` decoder threads (1 per DataLoader worker by default), returns
torch uint8 frames in the order of ``indices`` (duplicates allowed) and raises
:class:`DataError` naming the file for missing / empty / corrupt files and for indices past the
last decodable frame. Selecting a backend that cannot import raises
:class:`DecoderUnavailable` saying how to install it; the others keep working. With
``timeout_s > 0`` the backend runs in a helper process (:mod:`.decode_helper`, frames through
anonymous shared memory), so a hung or crashing decoder costs one sample, not the run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from avion_ds.data.crop import CropSpec, center_crop
from avion_ds.data.decode.base import (
    PLUGINS_ENV,
    REGISTRY,
    Decoder,
    DecoderUnavailable,
    load_plugins,
    register_backend,
)
from avion_ds.data.decode.helper import SubprocessDecoder
from avion_ds.data.decode.registry import (
    BACKENDS,
    DecordDecoder,
    PyAVDecoder,
    TorchCodecCudaDecoder,
    TorchCodecDecoder,
)
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import check_chunk_file, find_videos, probe_video
from avion_ds.data.prep.manifest_index import load_manifest

if TYPE_CHECKING:
    from avion_ds.config import DataConfig

__all__ = [
    "BACKENDS",
    "PLUGINS_ENV",
    "DataError",
    "Decoder",
    "DecoderUnavailable",
    "DecordDecoder",
    "PyAVDecoder",
    "SubprocessDecoder",
    "TorchCodecCudaDecoder",
    "TorchCodecDecoder",
    "available_backends",
    "get_decoder",
    "pick_decoder",
    "probe_backends",
    "probe_clips",
    "register_backend",
]

log = logging.getLogger(__name__)
AUTO = "auto"
RECORD_NAME = "decoder.json"
_PROBED: dict[tuple, dict[str, float]] = {}


def get_decoder(
    name: str = "decord", threads: int = 1, timeout_s: float = 0.0, fuse: bool = True, exact: bool = True
) -> Decoder | SubprocessDecoder:
    """The backend ``name``; wrapped in a helper process when ``timeout_s > 0``.

    ``exact=False`` allows timestamp seeking (see :class:`Decoder`); use it for chunked datasets.
    """
    load_plugins()
    if name == AUTO:  # no data to probe here (single-file tools): the first backend that imports
        found = available_backends()
        if not found:
            raise DecoderUnavailable(
                "data.decoder=auto: no decoder backend imports here (pip install decord av torchcodec)"
            )
        name = found[0]
        log.info("data.decoder=auto -> %s (first available backend; training probes its data instead)", name)
    if name not in REGISTRY:
        raise ValueError(f"unknown decoder {name!r} (choose from auto, {', '.join(sorted(REGISTRY))})")
    if timeout_s and timeout_s > 0:
        return SubprocessDecoder(name, threads, timeout_s, fuse, exact)
    return REGISTRY[name](threads, fuse, exact)


def available_backends(cuda: bool = False) -> list[str]:
    """CPU backends that import here (plus ``torchcodec-cuda`` when ``cuda`` and a GPU exists)."""
    ok = []
    for name in BACKENDS + (("torchcodec-cuda",) if cuda else ()):
        try:
            REGISTRY[name].check_available()
            ok.append(name)
        except DecoderUnavailable:
            pass
    return ok


def probe_clips(num_frames: int, span: int = 96, positions: int = 3) -> list[list[int]]:
    """Frame indices of the probe's clips: 16 frames spread over ``span`` frames (about the 1-4 s segments
    training samples), at ``positions`` places from the start to the end of the chunk.

    One clip from the first frames was not enough: decode cost and seek behaviour change along a chunk,
    and a probe of only the opening 64 frames picked PyAV where torchcodec is 1.2x faster on the rest.
    """
    span = max(1, min(num_frames, span))
    last = num_frames - span
    starts = sorted({round(i * last / max(1, positions - 1)) for i in range(positions)})
    return [sorted({s0 + int(i * span / 16) for i in range(16)}) for s0 in starts]


def probe_backends(
    path: str | Path,
    num_frames: int,
    height: int,
    width: int,
    size: int,
    names: list[str],
    timeout_s: float = 0.0,
    repeats: int = 4,
    exact: bool = False,
) -> dict[str, float]:
    """Seconds per round of the probe clips (``probe_clips``) per backend; a failing backend -> inf.

    The backends take turns (``repeats`` rounds) and each keeps its fastest round: on a shared
    machine the minimum is the least disturbed estimate of a backend's own speed.
    """
    clips = probe_clips(num_frames)
    crop = CropSpec(center_crop(height, width), (size, size), height, width)
    decs = {name: get_decoder(name, 1, timeout_s, exact=exact) for name in names}
    out = {name: math.inf for name in names}
    ok = set()
    try:
        for name, dec in decs.items():  # warm-up (helper start, library init); a failure rules a backend out
            try:
                dec.decode(path, clips[0], crop)
                ok.add(name)
            except (DataError, ValueError) as e:
                log.warning("decoder probe: %s failed on %s (%s)", name, path, e)
        for _ in range(repeats):
            for name in [n for n in names if n in ok]:
                t0 = time.perf_counter()
                for idx in clips:
                    decs[name].decode(path, idx, crop)
                out[name] = min(out[name], time.perf_counter() - t0)
    finally:
        for dec in decs.values():
            if isinstance(dec, SubprocessDecoder):
                dec.close()
    return out


PROBE_CANDIDATES = 4  # files tried in turn when a probe file decodes with no backend (a corrupt first chunk)


def _probe_videos(cfg: DataConfig) -> list[tuple[str, int, int, int]]:
    """(path, frames, height, width) of the first few chunks (or whole videos) of the dataset."""
    out: list[tuple[str, int, int, int]] = []
    if cfg.chunked:
        videos = load_manifest(cfg.root)
        for vid in sorted(videos):  # each video's first chunk that is on disk as its manifest row says
            c = next((c for c in videos[vid].chunks if check_chunk_file(c) is None), None)
            if c is None:
                continue
            out.append((c.path, c.frames, c.height, c.width))
            if len(out) == PROBE_CANDIDATES:
                break
        if not out:
            raise ValueError(f"data.decoder=auto: no chunk listed under {cfg.root} is on disk to probe")
        return out
    for p in find_videos(cfg.root):
        try:
            e = probe_video(p)
        except (OSError, ValueError):
            continue
        out.append((str(p), e.num_frames, e.height, e.width))
        if len(out) == PROBE_CANDIDATES:
            break
    if not out:
        raise ValueError(f"data.decoder=auto: no readable video under {cfg.root} to probe")
    return out


def pick_decoder(cfg: DataConfig, run_dir: str | Path | None = None, resume: bool = True) -> tuple[str, str]:
    """(backend, one-line reason): ``cfg.decoder`` unless it is ``auto``, else the recorded or probed choice."""
    if cfg.decoder != AUTO:
        return cfg.decoder, f"data.decoder={cfg.decoder} (from the recipe)"
    record = Path(run_dir) / RECORD_NAME if run_dir else None
    names = available_backends(cuda=True)  # NVDEC joins the probe where a GPU exists
    if not names:
        raise DecoderUnavailable(
            "data.decoder=auto: no decoder backend imports here (pip install decord av torchcodec)"
        )
    if record is not None and resume and record.is_file():
        try:
            name = json.loads(record.read_text()).get("decoder")
        except (json.JSONDecodeError, AttributeError):
            name = None
        if name in names:
            return name, f"data.decoder=auto -> {name} (recorded in {record}; resumed runs keep it)"
        log.warning("%s names decoder %r, which is not available here; probing again", record, name)
    if getattr(cfg, "shards", ""):  # the chunks are inside shards: nothing on disk to probe
        msg = f"data.decoder=auto -> {names[0]} (data.shards: no chunk files to probe; the first available backend)"
        log.info(msg)
        return names[0], msg
    tried = []
    for path, frames, h, w in _probe_videos(cfg):  # a file no backend decodes is bad data, not a verdict
        key = (path, Path(path).stat().st_mtime_ns, cfg.size, tuple(names))
        if key not in _PROBED:  # train + val datasets (and tests) probe a dataset once per process
            _PROBED[key] = probe_backends(
                path, frames, h, w, cfg.size, names, cfg.decode_timeout_s, exact=not cfg.chunked
            )
        times = _PROBED[key]
        name = min(names, key=lambda n: (times[n], names.index(n)))
        if math.isfinite(times[name]):
            break
        tried.append(path)
    else:
        raise DataError(f"data.decoder=auto: no backend could decode any of {', '.join(tried)}")
    ms = ", ".join(f"{n} {times[n] * 1e3:.1f} ms" for n in names)
    msg = (
        f"data.decoder=auto -> {name} (probe on {path}, {len(probe_clips(frames))} clips of 16 frames to "
        f"{cfg.size}px: {ms})"
    )
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(
            json.dumps({"decoder": name, "probe_s": {n: times[n] for n in names}, "chunk": path}, indent=2) + "\n"
        )
    log.info(msg)
    return name, msg

"""Decoder backends: same frames as PyAV decoding every frame, fused crops, bad files, timeouts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import avion_ds.data.decode.backend_torchcodec as decode_torchcodec
import avion_ds.data.decode.select as decoders
from avion_ds.data.crop import CropBox, CropSpec, crop_resize
from avion_ds.data.decode.select import (
    DataError,
    DecoderUnavailable,
    available_backends,
    get_decoder,
)
from avion_ds.data.prep.synthetic import read_frame_index, write_video

BACKENDS = available_backends()
IDX = [0, 7, 7, 29, 30, 31, 64, 149, 3]  # unsorted, duplicated, across GOPs, the last frame
PID_COUNTER = "/proc/sys/kernel/ns_last_pid"  # the last pid/tid the kernel handed out


def _mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


def test_all_three_backends_import_here() -> None:
    # CI installs Debian's ffmpeg so torchcodec loads; a missing backend would silently reduce coverage
    assert BACKENDS == ["decord", "torchcodec", "pyav"]


@pytest.mark.parametrize("name", BACKENDS)
def test_same_frames_as_pyav_reference(name, index_video, decode_all) -> None:
    ref = decode_all(index_video)
    out = get_decoder(name).decode(index_video, IDX)
    assert out.dtype == torch.uint8 and out.shape == (len(IDX), 72, 96, 3)
    assert [read_frame_index(f) for f in out.numpy()] == IDX
    assert _mad(out, ref[IDX]) < 1.0  # same FFmpeg colour conversion: identical or within codec rounding


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("fuse", [True, False])
def test_crop_resize_matches_reference(name, fuse, index_video, decode_all) -> None:
    ref = decode_all(index_video)
    crop = CropSpec(CropBox(top=10, left=20, height=50, width=60), (32, 32), 72, 96)
    out = get_decoder(name, fuse=fuse).decode(index_video, IDX, crop)
    want = crop_resize(ref[IDX], crop.box, crop.size)
    assert out.shape == (len(IDX), 32, 32, 3)
    # different (all bilinear-ish) resamplers; a wrong box or frame would be off by tens
    assert _mad(out, want) < (1.0 if not fuse else 6.0)


@pytest.mark.skipif("torchcodec" not in BACKENDS, reason="torchcodec not importable here")
def test_torchcodec_crop_hook_is_exact(index_video, decode_all) -> None:
    """The private crop-at-position hook must equal a tensor slice (guards a torchcodec upgrade)."""
    ref = decode_all(index_video)
    box = CropBox(top=5, left=13, height=40, width=50)
    dec = get_decoder("torchcodec")
    out = dec.decode(index_video, [4, 90], CropSpec(box, None, 72, 96))
    assert dec.hook_ok is True
    assert torch.equal(out, ref[[4, 90], 5:45, 13:63])


@pytest.mark.skipif("torchcodec" not in BACKENDS, reason="torchcodec not importable here")
def test_torchcodec_falls_back_when_hook_breaks(monkeypatch, index_video, decode_all, caplog) -> None:
    def broken(cls, box):
        raise TypeError("hook changed upstream")

    monkeypatch.setattr(decode_torchcodec.CropHook, "__new__", broken)
    dec = get_decoder("torchcodec")
    box = CropBox(0, 0, 48, 48)
    out = dec.decode(index_video, [1, 2], CropSpec(box, (24, 24), 72, 96))
    assert dec.hook_ok is False and "cropping after decode" in caplog.text
    assert _mad(out, crop_resize(decode_all(index_video)[[1, 2]], box, (24, 24))) < 1.0


def test_unavailable_backend_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # import fails like a missing FFmpeg
    with pytest.raises(DecoderUnavailable, match="decoder 'torchcodec' is not available.*apt-get install ffmpeg"):
        get_decoder("torchcodec")
    assert get_decoder("pyav").decode  # the others keep working
    with pytest.raises(ValueError, match="unknown decoder 'nope'"):
        get_decoder("nope")


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, index_video):
    d = tmp_path_factory.mktemp("bad")
    (d / "zero.mp4").write_bytes(b"")
    (d / "text.mp4").write_text("not a video at all\n" * 50)
    data = index_video.read_bytes()
    (d / "trunc.mp4").write_bytes(data[: len(data) // 3])  # moov atom at the end is gone
    write_video(d / "short.mp4", 10, 32, 32)
    return d


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    "case,reason",
    [
        ("missing.mp4", "file not found"),
        ("zero.mp4", "zero-byte file"),
        ("text.mp4", "could not decode"),
        ("trunc.mp4", "could not decode"),
        ("short.mp4", "asked for frame 20"),
    ],
)
def test_bad_files_raise_one_line_data_error(name, case, reason, bad_files) -> None:
    path = bad_files / case
    with pytest.raises(DataError) as e:
        get_decoder(name).decode(path, [2, 20])
    msg = str(e.value)
    assert msg.startswith(str(path)) and "\n" not in msg
    if name == "pyav" and case == "short.mp4":
        reason = "decoding stopped at frame 9, asked for frame 20"
    assert reason in msg


HANG_PLUGIN = """
import os, time
from avion_ds.data.decode.select import Decoder, register_backend

class Hang(Decoder):
    name = "hang"
    def _decode(self, path, indices, crop):
        if "crash" in path:
            os._exit(3)
        if "hang" in path:
            time.sleep(300)
        import numpy as np
        return np.zeros((len(indices), 4, 4, 3), np.uint8), crop is None

register_backend("hang", Hang)
"""


@pytest.fixture()
def hang_backend(tmp_path, monkeypatch):
    (tmp_path / "hang_plugin.py").write_text(HANG_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv(decoders.PLUGINS_ENV, "hang_plugin")
    for name in ("ok.mp4", "hang.mp4", "crash.mp4"):
        (tmp_path / name).write_bytes(b"x")
    yield tmp_path
    decoders.REGISTRY.pop("hang", None)


def test_timeout_kills_a_hung_decode_and_recovers(hang_backend) -> None:
    dec = get_decoder("hang", timeout_s=1.0)
    assert isinstance(dec, decoders.SubprocessDecoder)
    assert dec.decode(hang_backend / "ok.mp4", [0, 1, 1]).shape == (3, 4, 4, 3)
    first = dec.helper_pid
    with pytest.raises(DataError, match=r"hang.mp4: hang decode timed out after 1s"):
        dec.decode(hang_backend / "hang.mp4", [0])
    with pytest.raises(DataError, match=r"crash.mp4: hang decoder process died \(exit code 3\)"):
        dec.decode(hang_backend / "crash.mp4", [0])
    assert dec.decode(hang_backend / "ok.mp4", [5]).shape == (1, 4, 4, 3)  # a fresh helper
    assert dec.helper_pid != first
    dec.close()


@pytest.mark.parametrize("name", ["decord", "pyav"])
def test_subprocess_decoder_returns_same_frames(name, index_video) -> None:
    crop = CropSpec(CropBox(0, 0, 72, 72), (24, 24), 72, 96)
    dec = get_decoder(name, timeout_s=30.0)
    try:
        for idx in ([3, 1, 3], [100]):
            assert torch.equal(dec.decode(index_video, idx, crop), get_decoder(name).decode(index_video, idx, crop))
        with pytest.raises(DataError, match="asked for frame 500"):
            dec.decode(index_video, [500])
    finally:
        dec.close()


def test_decord_fused_falls_back_on_widths_decord_cannot_resize_to(index_video, decode_all) -> None:
    """decord 0.6 errors when resizing to width 48 (and 16, 24, 72); the read must still succeed."""
    # box 64 wide -> 32 px output needs the 96 px frame at width 48
    crop = CropSpec(CropBox(top=0, left=0, height=64, width=64), (32, 32), 72, 96)
    out = get_decoder("decord").decode(index_video, [1, 50], crop)
    want = crop_resize(decode_all(index_video)[[1, 50]], crop.box, crop.size)
    assert out.shape == (2, 32, 32, 3) and _mad(out, want) < 1.0


_COUNT_THREADS = """
import sys
from avion_ds.data.crop import CropBox, CropSpec
from avion_ds.data.decode.select import get_decoder
name, crop, path, idx = sys.argv[1], sys.argv[2] == "1", sys.argv[3], [int(i) for i in sys.argv[4].split(",")]
dec = get_decoder(name, threads=1)
spec = CropSpec(CropBox(top=10, left=20, height=50, width=60), (32, 32), 72, 96) if crop else None
dec.decode(path, idx, spec)  # warm: library init may start its own pools once
last_pid = lambda: int(open("/proc/sys/kernel/ns_last_pid").read())
before = last_pid()
dec.decode(path, idx, spec)
print("THREADS", last_pid() - before)
"""


def _threads_started_by_decode(name: str, crop: bool, video: Path) -> int:
    """Threads one warm decode creates, counted in a fresh PID namespace: its pid counter advances only for
    this subprocess's own threads, so other processes on a loaded machine cannot add to the count."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux's unshare")
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    cmd = [
        unshare,
        *userns,
        "--pid",
        "--fork",
        sys.executable,
        "-c",
        _COUNT_THREADS,
        name,
        "1" if crop else "0",
        str(video),
        ",".join(map(str, IDX)),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("THREADS ")), None)
    if line is None and "unshare" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"no PID namespace here: {proc.stderr.strip().splitlines()[-1]}")
    assert line is not None, proc.stderr[-3000:]
    return int(line.split()[1])


@pytest.mark.skipif(not os.path.exists(PID_COUNTER), reason="needs Linux's pid counter")
@pytest.mark.parametrize("name", [b for b in BACKENDS if b != "decord"])  # decord always runs a thread of its own
@pytest.mark.parametrize("crop", [True, False])
def test_one_thread_backends_start_no_threads(name, crop, index_video) -> None:
    """threads=1 means one: FFmpeg's defaults (filter graph and swscale at 0 = a thread per core) must not
    start threads behind the worker's back (a DataLoader with N workers would oversubscribe the cores)."""
    assert _threads_started_by_decode(name, crop, index_video) == 0

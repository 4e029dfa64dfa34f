"""tune_malloc: freed frame buffers are reused instead of re-faulted; workers and the helper apply it."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from avion_ds.data import build_loader
from avion_ds.data.decode.select import get_decoder
from avion_ds.distributed.malloc import ENV_SWITCH

# A decoder's pattern: each clip, a fresh thread (decord's own decode thread) allocates frame-sized buffers
# (2-3 MB), copies them, frees them. Counts the minor page faults (fresh memory) per clip.
_CLIPS = """
import resource, sys, threading
import numpy as np
from avion_ds.distributed.malloc import tune_malloc
assert sys.argv[1] == "plain" or tune_malloc()
def clip(k):
    a = np.ones((k, 320, 568, 3), np.uint8); b = a.copy(); del a, b
def clips(n):
    for i in range(n):
        t = threading.Thread(target=clip, args=(4 + i % 3,)); t.start(); t.join()
clips(6)  # warm-up: each malloc arena a clip thread gets is filled once, tuned or not
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
clips(20)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 20)
"""


def _faults_per_clip(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _CLIPS, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc mallopt")
def test_tuned_malloc_reuses_frame_buffers() -> None:
    plain, tuned = _faults_per_clip("plain"), _faults_per_clip("tuned")
    # ~1400 pages of buffers per clip: glibc's defaults fault in about half of them again every clip (measured
    # 480-600 after the warm-up); tuned, the buffers are reused: ~1, or ~80 when a thread gets a fresh arena
    assert plain > 300, plain
    assert tuned < 0.3 * plain, (plain, tuned)


def test_dataloader_workers_and_the_helper_apply_it(tmp_path, monkeypatch, index_video) -> None:
    marker = tmp_path / "tuned"
    import ctypes

    real_cdll = ctypes.CDLL

    class RecordingLibc:  # the C library seen through ctypes: the forked worker's mallopt calls leave a mark
        def __init__(self, name: object, *args: object, **kwargs: object) -> None:
            self._lib = real_cdll(name, *args, **kwargs)

        def __getattr__(self, attr: str) -> object:
            if attr == "mallopt":
                with marker.open("a") as f:
                    f.write("worker")
            return getattr(self._lib, attr)

    monkeypatch.setattr(ctypes, "CDLL", RecordingLibc)
    loader = build_loader([0, 1], batch_size=2, workers=1, shuffle=False, seed=0, drop_last=False, distributed=False)
    assert next(iter(loader)).tolist() == [0, 1]
    assert "worker" in marker.read_text()  # the forked worker's init reached mallopt
    monkeypatch.setattr(ctypes, "CDLL", real_cdll)
    for opt_out, expected in (("1", platform.libc_ver()[0] == "glibc"), ("0", False)):  # "0" reaches the helper
        monkeypatch.setenv(ENV_SWITCH, opt_out)
        dec = get_decoder("pyav", timeout_s=60)
        assert dec.helper_malloc_tuned is None  # not started yet
        dec.decode(index_video, [0])
        assert dec.helper_malloc_tuned is expected
        dec.close()

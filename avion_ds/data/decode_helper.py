"""Decode-timeout helper: a backend in a persistent child process, frames back through anonymous memory.

decord can spin forever on a container that over-reports frames (decord #373) while holding the
GIL, so a thread cannot bound it. :class:`SubprocessDecoder` runs the backend in one persistent
helper process per DataLoader worker (started lazily). Requests and one-line replies travel over
pipes as small pickles; the frames themselves are written by the child straight into a shared
anonymous buffer (``memfd_create``; an unlinked temporary file where memfd does not exist) that
both processes map, and the parent copies them out once. Nothing has a name in ``/dev/shm``, so
a killed process leaks nothing and a small ``/dev/shm`` in a container is no limit. A decode that
exceeds ``timeout_s`` kills the helper (a fresh one starts on the next call, reusing the buffer)
and raises :class:`DataError`; a crash (segfault) inside the decoder becomes a DataError the same
way instead of killing the DataLoader worker. The helper runs single-threaded math libraries
(OMP/MKL/torch 1 thread) so N workers never oversubscribe the cores.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .crop import CropSpec
from .decode_base import REGISTRY, finish, load_plugins, reason, validate
from .errors import DataError

if TYPE_CHECKING:
    import torch

STARTUP_LIMIT_S = 120.0  # a helper process must be importable and ready within this
_INITIAL_BYTES = 16 * 224 * 224 * 3  # one 16x224x224 RGB clip; the buffer grows on demand
_ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


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


def _anonymous_fd(size: int) -> int:
    """A file descriptor on anonymous memory of ``size`` bytes (memfd, else an unlinked temp file)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("avion_ds_frames", 0)  # no CLOEXEC: pass_fds hands it to the helper
    else:  # pragma: no cover - non-Linux
        fd = os.dup(tempfile.TemporaryFile().fileno())
    os.ftruncate(fd, size)
    return fd


class SharedBuffer:
    """A growable shared mapping of ``fd``; either side may grow it, the other remaps on next use."""

    def __init__(self, fd: int) -> None:
        self.fd, self.map = fd, None

    def view(self, need: int = 0) -> mmap.mmap:
        size = os.fstat(self.fd).st_size
        if need > size:
            os.ftruncate(self.fd, need)
            size = need
        if self.map is None or len(self.map) != size:
            if self.map is not None:
                self.map.close()
            self.map = mmap.mmap(self.fd, size)
        return self.map

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None


class SubprocessDecoder:
    """Runs backend ``name`` in a persistent child process so a hung or crashing decode is bounded."""

    def __init__(self, name: str, threads: int = 1, timeout_s: float = 60.0, fuse: bool = True,
                 exact: bool = True) -> None:
        REGISTRY[name].check_available()
        self.name, self.threads, self.timeout_s, self.fuse, self.exact = name, threads, float(timeout_s), fuse, exact
        self._proc: subprocess.Popen | None = None
        self._buf: SharedBuffer | None = None
        self._pid = os.getpid()

    @property
    def helper_pid(self) -> int | None:
        """Process id of the running helper (None before the first decode or after close)."""
        return self._proc.pid if self._proc is not None else None

    def _ensure(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # a forked copy: never share the parent's helper or buffer
            self._proc, self._buf = None, None
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None  # dead helper: start a fresh one
        if self._buf is None:
            self._buf = SharedBuffer(_anonymous_fd(_INITIAL_BYTES))
        if self._proc is None:
            self._pid = os.getpid()
            fd = self._buf.fd
            cmd = [sys.executable, "-m", "avion_ds.data.decode_helper", self.name, str(self.threads),
                   str(int(self.fuse)), str(int(self.exact)), str(fd)]
            # the libraries' own stderr (FFmpeg's "moov atom not found", decord's "ERROR opening") stays out
            # of the run log: each failure already comes back as one DataError line (AVION_DS_VERBOSE=1 keeps it)
            noise = None if os.environ.get("AVION_DS_VERBOSE") else subprocess.DEVNULL
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=noise,
                                          pass_fds=(fd,), env={**os.environ, **_ONE_THREAD})
            try:  # the helper says "ready" once its imports are done; only then does the decode clock run
                ready = _recv(self._proc.stdout.fileno(), time.monotonic() + STARTUP_LIMIT_S)
            except TimeoutError:
                ready = None
            if ready != "ready":
                self._kill()
                raise DataError(f"{self.name} decoder helper process did not start within {STARTUP_LIMIT_S:g}s")
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def decode(self, path: str | Path, indices: Sequence[int], crop: CropSpec | None = None) -> torch.Tensor:
        """Like :meth:`Decoder.decode`, bounded by ``timeout_s``."""
        import torch

        path, idx, uniq = validate(path, indices)
        proc = self._ensure()
        try:
            _send(proc.stdin.fileno(), (path, uniq, crop))
            reply = _recv(proc.stdout.fileno(), time.monotonic() + self.timeout_s)
        except TimeoutError:
            self._kill()
            raise DataError(f"{path}: {self.name} decode timed out after {self.timeout_s:g}s (helper process killed)") from None
        except (BrokenPipeError, OSError) as e:
            self._kill()
            raise DataError(f"{path}: {self.name} decoder process failed ({reason(e)})") from None
        if reply is None:
            code = proc.wait()
            self._proc = None
            raise DataError(f"{path}: {self.name} decoder process died (exit code {code}) while decoding")
        kind, payload = reply
        if kind == "ok":
            shape, done = payload
            n = int(np.prod(shape))
            frames = torch.empty(shape, dtype=torch.uint8)
            frames.numpy().reshape(-1)[:] = np.frombuffer(self._buf.view(), np.uint8, n)  # the one copy out
            return finish(frames, done, crop, uniq, idx)
        if kind == "data":
            raise DataError(payload)
        raise ValueError(payload)

    def close(self) -> None:
        if self._pid != os.getpid():
            self._proc, self._buf = None, None
            return
        if self._proc is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - the helper is already gone
                self._kill()
        self._proc = None
        if self._buf is not None:
            self._buf.close()
            os.close(self._buf.fd)
            self._buf = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - never raise from __del__
            pass

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_proc"], state["_buf"] = None, None
        return state


def serve(name: str, threads: int, fuse: bool, exact: bool, fd: int) -> int:
    """Helper-process loop: framed pickled requests on stdin, frames into the shared buffer."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints / library logs go to stderr, never into the reply stream
    in_fd = sys.stdin.fileno()
    load_plugins()
    dec = REGISTRY[name](threads, fuse, exact)
    import torch  # backends crop + resize with torchvision: import it before "ready", outside the decode clock
    from torchvision.transforms.v2 import functional  # noqa: F401

    torch.set_num_threads(1)
    buf = SharedBuffer(fd)
    _send(out_fd, "ready")
    while True:
        req = _recv(in_fd)
        if req is None:
            return 0
        path, uniq, crop = req
        try:
            frames, done = dec.decode_raw(path, uniq, crop)
            frames = frames.numpy() if hasattr(frames, "numpy") else np.asarray(frames)
            mm = buf.view(frames.nbytes)
            np.frombuffer(mm, np.uint8, frames.nbytes).reshape(frames.shape)[...] = frames
            reply = ("ok", (tuple(frames.shape), done))
        except DataError as e:
            reply = ("data", str(e))
        except Exception as e:  # noqa: BLE001 - reported to the parent as one line
            reply = ("error", f"{path}: {reason(e)}")
        _send(out_fd, reply)


if __name__ == "__main__":
    from avion_ds.data import decode_backends  # noqa: F401 - registers the built-in backends (plugins load in serve)

    sys.exit(serve(sys.argv[1], int(sys.argv[2]), bool(int(sys.argv[3])), bool(int(sys.argv[4])), int(sys.argv[5])))

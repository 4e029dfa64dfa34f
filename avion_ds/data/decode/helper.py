"""Decode-timeout helper: a backend in a persistent child process, frames back through anonymous memory.

decord can spin forever on a container that over-reports frames (decord #373) while holding the
GIL, so a thread cannot bound it. :class:`SubprocessDecoder` runs the backend in one persistent
helper process per DataLoader worker (started lazily: a fork of the worker, whose imports are done, unless
this process holds a CUDA context or the backend decodes on a GPU, then a fresh interpreter). Requests and one-line replies travel over
pipes as small pickles; the frames never do. They live in anonymous shared memory
(``memfd_create``; unlinked temporary files where memfd does not exist) that both processes map:
the backend's fused crop writes its output straight into one of ``SLOTS`` shared regions, and the
parent hands that region out as the returned tensor without copying it. A region is reused only
once no tensor views it any more (a weak reference to the array the parent handed out); when every
region is still in use, or a result is bigger than ``SLOT_MAX_BYTES`` (whole frames), the child
writes into a scratch region and the parent copies the frames out once. A pass through the helper
thus costs one pipe round trip (two process wake-ups) and two small pickles, not copies. After a
fork, regions still in use are never reused (the child may still read the frames through its copy).
Memory: a region keeps its largest size while the decoder lives (at most ``SLOTS`` x ``SLOT_MAX_BYTES``
= 64 MiB of clips, in practice one 2.4 MB clip per region in use, plus the scratch region at the
largest whole-frame read): pages of released clips stay with the decoder for reuse. Nothing has a name in
``/dev/shm``, so a killed process leaks nothing and a small ``/dev/shm`` in a container is no limit.
A decode that exceeds ``timeout_s`` kills the helper (a fresh one starts on the next call, reusing
the regions) and raises :class:`DataError`; a crash (segfault) inside the decoder becomes a DataError the same
way instead of killing the DataLoader worker. The helper runs single-threaded math libraries
(OMP/MKL/torch 1 thread) so N workers never oversubscribe the cores, and tunes its malloc
(:mod:`.malloc`: frame buffers reused, not re-faulted; ``helper_malloc_tuned`` says whether it took).
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from avion_ds.data.crop import CropSpec
from avion_ds.data.decode.base import REGISTRY, Source, check_frame_indices, finish, load_plugins, reason
from avion_ds.data.errors import DataError
from avion_ds.distributed.malloc import tune_malloc

if TYPE_CHECKING:
    import torch

STARTUP_LIMIT_S = 120.0  # a helper process must be importable and ready within this
SLOTS = 8  # shared regions handed out without a copy (one more, the scratch region, is always copied out)
SLOT_MAX_BYTES = 8 << 20  # a bigger result (whole frames) goes through the scratch region
_INITIAL_BYTES = 16 * 224 * 224 * 3  # one 16x224x224 RGB clip; a region grows on demand (pages cost on touch)
_ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def _send(fd: int, obj: object) -> None:
    data = pickle.dumps(obj, protocol=5)
    data = struct.pack("<Q", len(data)) + data
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _recv(fd: int, deadline: float | None = None) -> object | None:
    """One framed pickle (usually a single read); None at EOF; TimeoutError past ``deadline`` (monotonic)."""
    buf, need = bytearray(), 8
    while len(buf) < need:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, max(need - len(buf), 1 << 16))  # never past this message: one request at a time
        if not chunk:
            return None
        buf += chunk
        if need == 8 and len(buf) >= 8:
            need = 8 + struct.unpack_from("<Q", buf)[0]
    return pickle.loads(memoryview(buf)[8:need])


def _anonymous_fd(size: int) -> int:
    """A file descriptor on anonymous memory of ``size`` bytes (memfd, else an unlinked temp file)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("avion_ds_frames", 0)  # no CLOEXEC: pass_fds hands it to the helper
    else:  # pragma: no cover - non-Linux
        fd = os.dup(tempfile.TemporaryFile().fileno())  # noqa: SIM115 - only the dup'd fd outlives this line
    os.ftruncate(fd, size)
    return fd


class SharedBuffer:
    """A growable shared mapping of ``fd``; either side may grow it, the other remaps on next use.

    A remap never closes the old mapping: tensors handed out over it keep it (and their bytes) alive.
    """

    def __init__(self, fd: int) -> None:
        self.fd, self.map = fd, None

    def view(self, need: int = 0) -> mmap.mmap:
        size = os.fstat(self.fd).st_size
        if need > size:
            os.ftruncate(self.fd, need)
            size = need
        if self.map is None or len(self.map) != size:
            self.map = mmap.mmap(self.fd, size)
        return self.map

    def close(self) -> None:
        self.map = None  # unmapped once the last tensor over it is gone


class _Retired:
    """A region's marker after a fork: in use forever (a forked child may still read the frames)."""

    def __call__(self) -> bool:
        return True


_INSTANCES: weakref.WeakSet[SubprocessDecoder] = weakref.WeakSet()


_HELPER_FORK = [False]  # True while a ForkedHelper forks: its child never reads the parent's regions


def _retire_held_regions() -> None:
    if _HELPER_FORK[0]:
        return
    for dec in list(_INSTANCES):
        dec._retire()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_retire_held_regions)


def fork_is_safe(name: str) -> bool:
    """Whether backend ``name``'s helper may be a fork of this process: POSIX ``fork``, a CPU backend, and no
    CUDA context here (a forked child cannot use its parent's). A DataLoader worker is itself a fork of its
    rank, so its helper is one more of the same kind; otherwise the helper is a fresh interpreter."""
    if not hasattr(os, "fork") or getattr(REGISTRY[name], "device", "cpu") != "cpu":
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


class ForkedHelper:
    """A helper forked from this process (its imports already paid), with the part of
    :class:`subprocess.Popen` the decoder uses: ``pid``, ``stdin`` / ``stdout`` pipes, ``poll``, ``wait``,
    ``kill``. The child closes the parent's ends of its pipes and of every other helper's, so it sees EOF
    (and exits) when the parent goes."""

    def __init__(self, name: str, threads: int, fuse: bool, exact: bool, fds: list[int], quiet: bool) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        others = [f for d in list(_INSTANCES) for f in d.pipe_fds()]
        sys.stdout.flush()
        sys.stderr.flush()
        _HELPER_FORK[0] = True
        try:
            pid = os.fork()
        finally:
            _HELPER_FORK[0] = False
        if pid == 0:  # the helper: never returns
            _serve_forked(req_r, rep_w, [req_w, rep_r, *others], (name, threads, fuse, exact, fds), quiet)
        os.close(req_r)
        os.close(rep_w)
        self.pid, self.returncode = pid, None
        self.stdin, self.stdout = os.fdopen(req_w, "wb", buffering=0), os.fdopen(rep_r, "rb", buffering=0)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                done, status = self.pid, 0
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"decoder helper {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _serve_forked(req: int, rep: int, close: list[int], args: tuple, quiet: bool) -> NoReturn:
    """In the forked child: requests on fd 0, replies on fd 1, stderr to /dev/null when ``quiet``; exits."""
    code = 1
    try:
        for fd in close:
            try:
                os.close(fd)
            except OSError:
                pass
        os.dup2(req, 0)
        os.dup2(rep, 1)
        if quiet:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os.environ.update(_ONE_THREAD)
        code = serve(*args)
    finally:
        os._exit(code)


class SubprocessDecoder:
    """Runs backend ``name`` in a persistent child process so a hung or crashing decode is bounded."""

    def __init__(
        self, name: str, threads: int = 1, timeout_s: float = 60.0, fuse: bool = True, exact: bool = True
    ) -> None:
        REGISTRY[name].check_available()
        self.name, self.threads, self.timeout_s, self.fuse, self.exact = name, threads, float(timeout_s), fuse, exact
        self._proc: subprocess.Popen | ForkedHelper | None = None
        self._bufs: list[SharedBuffer] | None = None  # SLOTS regions handed out, then the scratch region
        self._held: list[Callable[[], object] | None] = [None] * SLOTS  # the array handed out from each region
        self._pid = os.getpid()
        self.helper_cpu_s = 0.0  # CPU seconds the current helper process has used so far (benchmarks read it)
        self.helper_malloc_tuned: bool | None = None  # the helper applied tune_malloc (None: not started yet)
        _INSTANCES.add(self)

    def _retire(self) -> None:
        self._held = [_Retired() if h is not None and h() is not None else h for h in self._held]

    @property
    def helper_pid(self) -> int | None:
        """Process id of the running helper (None before the first decode or after close)."""
        return self._proc.pid if self._proc is not None else None

    def pipe_fds(self) -> list[int]:
        """This process's ends of the helper's pipes (a helper forked later closes them)."""
        if self._proc is None or self._pid != os.getpid():
            return []
        return [f.fileno() for f in (self._proc.stdin, self._proc.stdout) if f is not None and not f.closed]

    def region_states(self) -> list[str]:
        """Each handed-out region's state: ``free``, ``in use`` (a returned tensor views it) or ``retired``
        (in use when the process forked: never written again). For tests and debugging."""

        def state(held: Callable[[], object] | None) -> str:
            if isinstance(held, _Retired):
                return "retired"
            return "in use" if held is not None and held() is not None else "free"

        return [state(h) for h in self._held]

    def region(self, i: int) -> SharedBuffer:
        """Shared region ``i`` (``SLOTS``: the scratch region); exists once the helper has started."""
        if self._bufs is None:
            raise RuntimeError("no shared regions yet: decode something first")
        return self._bufs[i]

    def _ensure(self) -> subprocess.Popen | ForkedHelper:
        if self._pid != os.getpid():  # a forked copy: never share the parent's helper or regions
            self._proc, self._bufs, self._held = None, None, [None] * SLOTS
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None  # dead helper: start a fresh one
        if self._bufs is None:
            self._bufs = [SharedBuffer(_anonymous_fd(_INITIAL_BYTES)) for _ in range(SLOTS + 1)]
        if self._proc is None:
            self._pid = os.getpid()
            self._proc = self._start([b.fd for b in self._bufs])
            try:  # the helper says "ready" once its imports are done; only then does the decode clock run
                ready = _recv(self._proc.stdout.fileno(), time.monotonic() + STARTUP_LIMIT_S)
            except TimeoutError:
                ready = None
            if not (isinstance(ready, tuple) and ready[0] == "ready"):
                self._kill()
                raise DataError(f"{self.name} decoder helper process did not start within {STARTUP_LIMIT_S:g}s")
            self.helper_malloc_tuned = bool(ready[1])
        return self._proc

    def _start(self, fds: list[int]) -> subprocess.Popen | ForkedHelper:
        """The helper process: a fork of this one where that is safe (:func:`fork_is_safe`: its imports are
        paid already, ~3 s of CPU per DataLoader worker spared), else a fresh interpreter."""
        # the libraries' own stderr (FFmpeg's "moov atom not found", decord's "ERROR opening") stays out
        # of the run log: each failure already comes back as one DataError line (AVION_DS_VERBOSE=1 keeps it)
        quiet = not os.environ.get("AVION_DS_VERBOSE")
        if fork_is_safe(self.name):
            return ForkedHelper(self.name, self.threads, self.fuse, self.exact, fds, quiet)
        cmd = [sys.executable, "-m", "avion_ds.data.decode.helper", self.name, str(self.threads)]
        cmd += [str(int(self.fuse)), str(int(self.exact)), ",".join(map(str, fds))]
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            pass_fds=fds,
            env={**os.environ, **_ONE_THREAD},
        )

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _free_region(self) -> int:
        """A region no handed-out tensor views any more, else the scratch region (``SLOTS``)."""
        for i, held in enumerate(self._held):
            if held is None or held() is None:
                return i
        return SLOTS

    def decode(self, path: Source, indices: Sequence[int], crop: CropSpec | None = None) -> torch.Tensor:
        """Like :meth:`Decoder.decode`, bounded by ``timeout_s`` (a MemoryVideo's bytes go to the helper in
        the request's pickle)."""
        import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

        path, idx, uniq = check_frame_indices(path, indices)
        proc = self._ensure()
        region = self._free_region()
        try:
            _send(proc.stdin.fileno(), (path, uniq, crop, region))
            reply = _recv(proc.stdout.fileno(), time.monotonic() + self.timeout_s)
        except TimeoutError:
            self._kill()
            raise DataError(
                f"{path}: {self.name} decode timed out after {self.timeout_s:g}s (helper process killed)"
            ) from None
        except (BrokenPipeError, OSError) as e:
            self._kill()
            raise DataError(f"{path}: {self.name} decoder process failed ({reason(e)})") from None
        if reply is None:
            code = proc.wait()
            self._proc = None
            raise DataError(f"{path}: {self.name} decoder process died (exit code {code}) while decoding")
        kind, payload = reply
        if kind == "ok":
            shape, done, where, self.helper_cpu_s = payload
            arr = np.frombuffer(self._bufs[where].view(), np.uint8, math.prod(shape))
            if where < SLOTS:  # handed out as is; the region is reused once this array is gone
                self._held[where] = weakref.ref(arr)
            else:
                arr = arr.copy()  # the scratch region: the one copy out
            return finish(torch.from_numpy(arr).view(shape), done, crop, uniq, idx)
        if kind == "data":
            raise DataError(payload)
        raise ValueError(payload)

    def close(self) -> None:
        if self._pid != os.getpid():
            self._proc, self._bufs = None, None
            return
        if self._proc is not None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - the helper is already gone
                self._kill()
        self._proc = None
        if self._bufs is not None:
            for b in self._bufs:  # frames handed out keep their mapping (the fd is not needed for that)
                b.close()
                os.close(b.fd)
            self._bufs, self._held = None, [None] * SLOTS

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - never raise from __del__
            pass

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_proc"], state["_bufs"], state["_held"] = None, None, [None] * SLOTS
        return state


def serve(name: str, threads: int, fuse: bool, exact: bool, fds: list[int]) -> int:
    """Helper-process loop: framed pickled requests on stdin, frames into the shared region the parent named."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints / library logs go to stderr, never into the reply stream
    in_fd = 0  # requests (not sys.stdin: a test runner may have replaced it in a forked helper)
    load_plugins()
    dec = REGISTRY[name](threads, fuse, exact)
    # backends crop + resize with torchvision: import it before "ready", outside the decode clock
    import torch  # lazy: heavy, imported here once the helper's backend is chosen
    from torchvision.transforms.v2 import functional  # noqa: F401  # lazy: as torch

    torch.set_num_threads(1)
    bufs = [SharedBuffer(fd) for fd in fds]
    target: list = [None, None]  # (region, tensor) the backend's fused crop wrote into

    def alloc(shape: tuple[int, ...]) -> torch.Tensor | None:
        n = math.prod(shape)
        if target[0] == len(bufs) - 1 or n > SLOT_MAX_BYTES:  # scratch / oversized: the backend allocates
            return None
        target[1] = torch.frombuffer(bufs[target[0]].view(n), dtype=torch.uint8, count=n).view(shape)
        return target[1]

    dec.alloc = alloc
    _send(out_fd, ("ready", tune_malloc()))
    while True:
        req = _recv(in_fd)
        if req is None:
            return 0
        path, uniq, crop, region = req
        target[:] = [region, None]
        try:
            frames, done = dec.decode_raw(path, uniq, crop)
            frames = torch.from_numpy(frames) if isinstance(frames, np.ndarray) else frames
            out = target[1]
            if out is None or frames.data_ptr() != out.data_ptr() or frames.shape != out.shape:
                n = frames.numel()
                region = region if n <= SLOT_MAX_BYTES else len(bufs) - 1
                view = torch.frombuffer(bufs[region].view(n), dtype=torch.uint8, count=n)
                view.view(frames.shape).copy_(frames)  # frames from the library itself: the one copy in
            reply = ("ok", (tuple(frames.shape), done, region, time.process_time()))
        except DataError as e:
            reply = ("data", str(e))
        except Exception as e:  # noqa: BLE001 - reported to the parent as one line
            reply = ("error", f"{path}: {reason(e)}")
        frames = out = view = None
        target[:] = [None, None]
        _send(out_fd, reply)


if __name__ == "__main__":
    import avion_ds.data.decode.registry  # noqa: F401 - registers the built-in backends (plugins load in serve)

    sys.exit(
        serve(
            sys.argv[1],
            int(sys.argv[2]),
            bool(int(sys.argv[3])),
            bool(int(sys.argv[4])),
            [int(x) for x in sys.argv[5].split(",")],
        )
    )

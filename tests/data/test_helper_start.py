"""How the decode-timeout helper starts: forked from its DataLoader worker (imports already paid) where that is
safe, a fresh interpreter where it is not (a CUDA context here, a GPU backend); the same frames either way, and a
forked helper ends with its parent."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from avion_ds.data.crop import CropBox, CropSpec
from avion_ds.data.decode import helper
from avion_ds.data.decode.select import DataError, get_decoder

CROP = CropSpec(CropBox(0, 0, 72, 72), (24, 24), 72, 96)


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("cuda", [False, True], ids=["forked", "spawned"])
def test_forked_and_spawned_helpers_return_the_same_frames(cuda, index_video, monkeypatch) -> None:
    """Forked here (torch imported, no CUDA context); a fresh interpreter once this process holds a CUDA
    context (as a GPU rank does after its first kernel): the same frames and errors either way."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda)
    dec = get_decoder("pyav", timeout_s=30.0)
    try:
        for idx in ([3, 1, 3], [100]):
            assert torch.equal(dec.decode(index_video, idx, CROP), get_decoder("pyav").decode(index_video, idx, CROP))
        assert ("avion_ds.data.decode.helper" in _cmdline(dec.helper_pid)) is cuda  # a fork runs this command line
        with pytest.raises(DataError, match="asked for frame 500"):
            dec.decode(index_video, [500])
    finally:
        dec.close()


def test_fork_only_without_a_cuda_context_and_for_cpu_backends(monkeypatch) -> None:
    assert helper.fork_is_safe("pyav")  # the test process: torch imported, no CUDA context
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as on a GPU rank after its first kernel
    assert not helper.fork_is_safe("pyav")
    monkeypatch.undo()
    monkeypatch.setattr(helper.REGISTRY["pyav"], "device", "cuda", raising=False)  # a GPU decoding backend
    assert not helper.fork_is_safe("pyav")


_PARENT = """
import sys, time
from avion_ds.data.decode.select import get_decoder
a, b = get_decoder("pyav", timeout_s=30.0), get_decoder("pyav", timeout_s=30.0)
a.decode(sys.argv[1], [0]); b.decode(sys.argv[1], [0])
print(a.helper_pid, b.helper_pid, flush=True)
time.sleep(300)
"""


def test_forked_helpers_end_when_their_parent_is_killed(index_video) -> None:
    """Two helpers in one process (the second forked while the first's pipes are open): SIGKILL to the parent
    ends both (each sees EOF on its requests: no other process holds their write ends)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _PARENT, str(index_video)], stdout=subprocess.PIPE, env=env)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        assert all("avion_ds.data.decode.helper" not in _cmdline(p) for p in pids)  # forked, not spawned
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), [p for p in pids if _alive(p)]
    finally:
        proc.kill()
        proc.wait()


def _pipe_ends(pid: int) -> set[tuple[str, int]]:
    """(pipe, access mode) of each pipe end process ``pid`` holds."""
    out = set()
    for f in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{f}")
        if target.startswith("pipe:"):
            flags = Path(f"/proc/{pid}/fdinfo/{f}").read_text().split("flags:")[1].split()[0]
            out.add((target, int(flags, 8) & os.O_ACCMODE))
    return out


def _end(fd: int) -> tuple[str, int]:
    """(pipe, access mode) of this process's ``fd``."""
    return os.readlink(f"/proc/self/fd/{fd}"), fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE


def test_a_forked_helper_holds_no_other_helpers_pipe(index_video) -> None:
    """A helper forked while another helper runs holds neither its own requests' write end nor the other's
    pipes: each helper's requests end (EOF) exactly when this process closes them or exits."""
    first, second = get_decoder("pyav", timeout_s=30.0), get_decoder("pyav", timeout_s=30.0)
    try:
        first.decode(index_video, [0])
        second.decode(index_video, [0])
        mine = {d: {_end(fd) for fd in d.pipe_fds()} for d in (first, second)}
        assert len(mine[first]) == len(mine[second]) == 2
        assert not (mine[first] | mine[second]) & _pipe_ends(second.helper_pid)
        assert not mine[first] & _pipe_ends(first.helper_pid)
        pid = first.helper_pid
        first.close()  # EOF on its requests: it exits by itself
        assert not _alive(pid)
    finally:
        first.close()
        second.close()

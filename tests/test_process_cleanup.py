"""Ending a test run ends everything it started. A pytest subprocess (this suite's conftest) runs two
tests that launch 2 torchrun ranks through ``tests.helpers.launch``, each rank a stand-in that records its
pid and sleeps: the first test is ended by pytest-timeout, the second is running when pytest gets
SIGTERM. No rank or launcher survives either, and both rendezvous ports are free again; also when the
tests run in pytest-xdist workers (as tests/run.sh runs them) and the SIGTERM goes to the controller."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import REPO, engine_env, free_port
from tests.helpers.reaper import kill_tree

pytestmark = pytest.mark.multiprocess

RANK = """import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"{os.environ['RANK']}.pid").write_text(f"{os.getpid()} {os.getppid()}")
time.sleep(600)
"""

INNER = """import os
from pathlib import Path

import pytest

from tests.helpers import launch

HERE = Path(os.environ["CLEANUP_DIR"])


@pytest.mark.timeout(TIMEOUT)
def test_ended_by_pytest_timeout() -> None:
    launch([HERE / "timed_out"], script_path=HERE / "rank.py", port=int(os.environ["PORT_A"]))


def test_running_when_pytest_gets_sigterm() -> None:
    launch([HERE / "sigterm"], script_path=HERE / "rank.py", port=int(os.environ["PORT_B"]))
"""


def _pids(folder: Path, deadline: float) -> set[int]:
    """The 2 ranks' pids and their parents' (the launcher's), once both ranks have written them."""
    files = [folder / "0.pid", folder / "1.pid"]
    while not all(f.is_file() and f.read_text() for f in files):
        assert time.monotonic() < deadline, f"the ranks never started under {folder}"
        time.sleep(0.2)
    return {int(x) for f in files for x in f.read_text().split()}


def _alive(pids: set[int]) -> list[str]:
    """The pids of ``pids`` still running (zombies count as ended), with their command lines."""
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid}: {' '.join(p.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadgroup"]], ids=["one_process", "xdist"])
def test_timeout_and_sigterm_end_every_rank_and_launcher(tmp_path: Path, workers: list[str]) -> None:
    timeout_s = 10
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "test_inner.py").write_text(INNER.replace("TIMEOUT", str(timeout_s)))
    ports = {"PORT_A": str(free_port()), "PORT_B": str(free_port())}
    env = engine_env(CLEANUP_DIR=str(tmp_path), **ports)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    pytest_proc = subprocess.Popen(
        [*cmd, *workers, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        timed_out = _pids(tmp_path / "timed_out", deadline)
        killed = _pids(tmp_path / "sigterm", deadline + timeout_s)
        # under xdist the two inner tests run at once: the timed-out one may still be inside its timeout
        while _alive(timed_out) and time.monotonic() < deadline + 3 * timeout_s:
            time.sleep(0.2)
        assert not _alive(timed_out), f"left running after pytest-timeout: {_alive(timed_out)}"
        pytest_proc.send_signal(signal.SIGTERM)
        out, _ = pytest_proc.communicate(timeout=60)
    finally:
        kill_tree(pytest_proc.pid)  # this test's own cleanup, whatever happened
    assert pytest_proc.returncode == -signal.SIGTERM, out[-3000:]
    assert not _alive(killed), f"left running after SIGTERM to pytest: {_alive(killed)}"
    assert all(_port_free(int(p)) for p in ports.values()), f"a rendezvous port is still held: {ports}"

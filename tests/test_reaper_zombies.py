"""The pytest process adopts orphaned ranks (subreaper), so it must also wait for them once they exit; at exit it
ends what it started, but not its own multiprocessing resource tracker."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import REPO, reaper


def test_an_exited_orphan_is_reaped_after_its_test() -> None:
    """A launcher that exits before its rank leaves the rank to pytest; when the rank ends it is a zombie
    of pytest until ``reap_adopted`` (run after every test) waits for it."""
    if not reaper.adopt_orphans():
        pytest.skip("no subreaper on this OS")
    out = subprocess.run(["bash", "-c", "sleep 0.5 & echo $!"], capture_output=True, text=True, check=True)
    pid = int(out.stdout.split()[0])
    rank = psutil.Process(pid)
    assert rank.ppid() == psutil.Process().pid  # adopted by this process, not by init
    deadline = time.monotonic() + 30
    while rank.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the orphan did not exit"
        time.sleep(0.05)
    assert pid in reaper.reap_adopted()
    assert not psutil.pid_exists(pid)


def test_a_child_that_its_popen_still_waits_for_is_left_alone() -> None:
    """An exited child whose ``Popen`` has not been waited yet keeps its exit status for that Popen."""
    proc = subprocess.Popen(["bash", "-c", "exit 3"])
    deadline = time.monotonic() + 30
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.pid not in reaper.reap_adopted()
    assert proc.wait() == 3


EXITING = """import subprocess, sys, multiprocessing
from tests.helpers import reaper
reaper.install()
# a named semaphore (as under litdata's "spawn"), registered with this process's resource tracker
lock = multiprocessing.get_context("spawn").Lock()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
print(multiprocessing.resource_tracker._resource_tracker._pid, child.pid, flush=True)
"""


def _ends(pid: int, what: str) -> None:
    deadline = time.monotonic() + 30
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"{what} outlived its process"
        time.sleep(0.05)


def test_the_end_of_a_run_ends_its_children_but_not_its_resource_tracker() -> None:
    """At exit the pytest process ends what it started (``kill_descendants``) but leaves its multiprocessing
    resource tracker to the semaphores' clean-up that runs after it: killed first, it was started again and
    printed "process died unexpectedly" and a KeyError traceback per semaphore at the end of every run."""
    proc = subprocess.run(
        [sys.executable, "-c", EXITING], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resource_tracker" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr[-3000:]
    tracker, child = (int(x) for x in proc.stdout.split())
    _ends(child, "the child")
    _ends(tracker, "the resource tracker")

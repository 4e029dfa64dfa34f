"""The pytest process adopts orphaned ranks (subreaper), so it must also wait for them once they exit."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from tests.helpers import reaper


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

"""Ending a test run ends every process it started: DeepSpeed / torchrun launchers, their ranks, helpers.

torchrun starts each rank in a session of its own and the deepspeed launcher runs ranks under a launch
process, so neither a process group nor the direct child reaches them all; the process tree does. The
pytest process makes itself the subreaper of its descendants (Linux), so a rank whose launcher was killed
is re-parented to pytest instead of init and stays in that tree. Then:

* ``run_process`` (every launch of ``tests.helpers``) ends the whole tree of its command when the test is
  interrupted (pytest-timeout, Ctrl-C, its own timeout);
* SIGTERM / SIGHUP to pytest, and the end of the run, end every descendant still alive (but pytest's own
  multiprocessing resource tracker and fork server, which end by themselves);
* after each test, the adopted ranks that have exited are reaped (``reap_adopted``): a subreaper must wait
  for them, or every multi-rank test leaves zombies (pids held) until the run ends.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import multiprocessing.popen_fork
import os
import shutil
import signal
import subprocess
from collections.abc import Collection
from multiprocessing import forkserver, resource_tracker
from types import FrameType

import psutil

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_INSTALLED_IN: list[int] = []  # the pid that installed the handlers (forked children inherit them)


def adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants; False where the OS has no such call."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_tree(pid: int, grace_s: float = 3.0, spare: Collection[int] = ()) -> list[int]:
    """SIGTERM ``pid``'s descendants and ``pid`` itself (unless it is this process), SIGKILL whatever is
    left after ``grace_s``; repeated while new descendants appear. ``spare``: pids left alone. Returns the
    pids signalled."""
    signalled: list[int] = []
    for _ in range(5):
        try:
            root = psutil.Process(pid)
            procs = root.children(recursive=True)
        except psutil.NoSuchProcess:
            procs, root = [], None
        if root is not None and pid != os.getpid() and root.pid not in signalled:
            procs.insert(0, root)
        procs = [p for p in procs if p.pid not in signalled and p.pid not in spare]
        if not procs:
            break
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        signalled += [p.pid for p in procs]
    return signalled


def tree_report(pid: int, limit_s: float = 20.0) -> str:
    """What ``pid`` and each of its descendants is doing: pid, state, command line and, where ``py-spy`` is
    installed, the Python stacks of every thread (for a command that timed out, before it is ended: a hang
    then names the process and the line it waits in)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return f"process {pid} is gone\n"
    spy, lines = shutil.which("py-spy"), []
    for p in procs:
        try:
            lines.append(f"--- pid {p.pid} ({p.status()}): {' '.join(p.cmdline())[:300]}")
        except psutil.Error:
            continue
        if spy is not None:
            try:
                dump = subprocess.run(
                    [spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=limit_s
                )
                lines.append((dump.stdout or dump.stderr).rstrip())
            except subprocess.TimeoutExpired:
                lines.append(f"py-spy dump gave nothing within {limit_s:g} s")
    return "\n".join(lines) + "\n"


def _multiprocessing_helpers() -> set[int]:
    """This process's multiprocessing resource tracker and fork server: they exit by themselves once this
    process has closed its pipe to them, after its exit handlers have used them (a tracker killed earlier is
    started again by the semaphores' clean-up, which then reports "process died unexpectedly" and a KeyError
    per semaphore)."""
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return {pid for pid in (tracker, server) if pid is not None}


def kill_descendants() -> list[int]:
    """End every process this one started but its multiprocessing helpers (only in the process that called
    ``install``)."""
    if _INSTALLED_IN != [os.getpid()]:
        return []
    return kill_tree(os.getpid(), spare=_multiprocessing_helpers())


def _waited_by_others() -> set[int]:
    """Pids a live ``subprocess.Popen`` or ``multiprocessing`` process object will wait for itself (reaping
    them here would take their exit status away)."""
    kinds = (subprocess.Popen, multiprocessing.popen_fork.Popen)
    owned = set()
    for o in gc.get_objects():
        try:
            if isinstance(o, kinds) and o.returncode is None:
                owned.add(o.pid)
        except ReferenceError:  # a weakref proxy whose referent is gone: isinstance asks it for __class__
            continue
    return owned


def reap_adopted() -> list[int]:
    """Wait for this process's exited children that no Popen / multiprocessing object owns (ranks adopted
    as orphans); returns their pids. Cheap when there is no zombie child (one /proc read)."""
    if _INSTALLED_IN != [os.getpid()]:
        return []
    try:
        zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []
    if not zombies:
        return []
    owned, reaped = _waited_by_others(), []
    for pid in zombies:
        if pid in owned:
            continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
        except ChildProcessError:
            pass
    return reaped


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """End the descendants, then die of the same signal as the default handler would."""
    kill_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install() -> None:
    """In the pytest process: adopt orphans, end descendants on SIGTERM / SIGHUP and at exit."""
    if _INSTALLED_IN:
        return
    _INSTALLED_IN.append(os.getpid())
    adopt_orphans()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    atexit.register(kill_descendants)

"""Fixtures shared by every test package."""

from __future__ import annotations

import os

import pytest
import torch.nn.functional as F

from tests.helpers import TORCH_EXTENSIONS, one_rank_vars, reaper

# DeepSpeed ops built in the pytest process share the op cache tests/run.sh exports (also under plain pytest)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS))


def pytest_configure(config: pytest.Config) -> None:
    """Ending the run ends what it started: SIGTERM / SIGHUP to pytest, or its exit, end every launcher
    and rank still alive (``tests/helpers/reaper.py``)."""
    reaper.install()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    """Ranks adopted during the test that have exited are waited for (no zombie outlives its test)."""
    reaper.reap_adopted()


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env a one-rank launcher sets, for tests that build a DeepSpeed engine in the pytest process;
    undone afterwards, so later launches of multi-rank subprocesses do not inherit it."""
    for key, value in one_rank_vars().items():
        monkeypatch.setenv(key, value)


@pytest.fixture(autouse=True, scope="session")
def no_hard_exit_in_pytest() -> object:
    """An in-process CLI call that reaches ``dist.shutdown`` -> ``os._exit`` (a process group left in the
    pytest process) would end the whole pytest run early with that call's exit code, a silent pass.
    In the pytest process itself, ``os._exit`` raises instead, so that test fails; forked children
    (DataLoader workers) still exit for real."""
    import os

    real_exit, pid = os._exit, os.getpid()

    def guarded_exit(code: int) -> None:
        if os.getpid() != pid:
            real_exit(code)
        raise RuntimeError(f"os._exit({code}) called inside the pytest process")

    os._exit = guarded_exit
    yield
    os._exit = real_exit


_TORCH_LINEAR = F.linear  # as torch defines it, before any test ran


@pytest.fixture(autouse=True)
def restore_torch_linear() -> object:
    """``deepspeed.zero.Init`` replaces ``torch.nn.functional.linear`` for the rest of the process (its
    memory-efficient linear); a test that builds a partitioned model in this process must not change how
    later tests' linears compute (FLOP counts, saved activations, last-bit results)."""
    yield
    F.linear = _TORCH_LINEAR  # the original, not what a module-scoped fixture's zero.Init left before the test

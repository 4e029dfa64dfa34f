"""Fixtures shared by every test package."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env a one-rank launcher sets, for tests that build a DeepSpeed engine in the pytest process;
    undone afterwards, so later launches of multi-rank subprocesses do not inherit it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(port))):
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

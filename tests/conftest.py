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


@pytest.fixture(autouse=True)
def no_process_group_left() -> object:
    """Destroy a process group a test left in the pytest process (an in-process DeepSpeed engine makes
    one): otherwise a later in-process CLI call ends through ``dist.shutdown`` -> ``os._exit`` and the
    whole pytest run stops early with that call's exit code."""
    yield
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()

"""pytest plugin: wall and CPU seconds per test (this process + every waited-for child process), a
figure that a loaded machine inflates far less than wall time.

    PYTHONPATH=$PWD:$PWD/bench python3 -m pytest -q -p pytest_cputime tests/engine/test_elastic.py
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest

_ROWS: list[tuple[str, float, float]] = []


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    t0, c0 = time.time(), _cpu()
    yield
    _ROWS.append((item.nodeid, time.time() - t0, _cpu() - c0))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line("CPUTIME  wall_s   cpu_s  test")
    for name, wall, cpu in _ROWS:
        terminalreporter.write_line(f"CPUTIME {wall:7.1f} {cpu:7.1f}  {name}")
    terminalreporter.write_line(f"CPUTIME {sum(r[1] for r in _ROWS):7.1f} {sum(r[2] for r in _ROWS):7.1f}  TOTAL")

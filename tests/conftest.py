"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys

import pytest
import torch.nn.functional as F

from tests.helpers import TORCH_EXTENSIONS, one_rank_vars, reaper

# DeepSpeed ops built in the pytest process share the op cache tests/run.sh exports (also under plain pytest)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS))
# pytest keeps each test module's assert-rewritten bytecode in tests/**/__pycache__ unless Python may not write
# bytecode (PYTHONDONTWRITEBYTECODE=1 on some VMs): then every run rewrites all of them again, in each worker,
# ~4 s of the quick loop's collection. This process writes them, as tests/run.sh compiles the package's own.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """Ending the run ends what it started: SIGTERM / SIGHUP to pytest, or its exit, end every launcher
    and rank still alive (``tests/helpers/reaper.py``)."""
    reaper.install()
    config.addinivalue_line(
        "markers",
        "doc_run(doc, needle): the test reads the documented run of that cpu block (tests/e2e/conftest.py: "
        "doc_block) and runs in its run group",
    )


def doc_run_group(item: pytest.Item) -> str:
    """The run group of the documented run ``item`` reads (tests/e2e/conftest.py: ``run_group``): the block
    it is parametrized with, or the one its ``doc_run`` mark names."""
    from tests.e2e.conftest import doc_block, run_group
    from tests.e2e.doc_blocks import Block

    mark = item.get_closest_marker("doc_run")
    params = getattr(getattr(item, "callspec", None), "params", {})
    block = doc_block(*mark.args) if mark else params.get("block")
    if not isinstance(block, Block):
        raise pytest.UsageError(f"{item.nodeid} uses doc_runs: mark it @pytest.mark.doc_run(DOC, NEEDLE)")
    return run_group(block)


def worker_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group ``item`` must run in (``--dist loadgroup``), or None where any worker may
    take it: tests of a documented run share its run group (its blocks and the flows that read them);
    tests that share a module, class or package fixture share their module (package) so the fixture is
    built once, not once per worker."""
    by_name = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    if "doc_runs" in by_name:
        return doc_run_group(item)
    scopes = {d.scope for ds in by_name.values() for d in ds}
    if "package" in scopes:
        return str(item.path.parent)
    if scopes & {"module", "class"}:
        return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook turns the marks into the group ids it schedules
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n N --dist loadgroup`` (tests/run.sh): each test joins its ``worker_group``."""
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            group = worker_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))


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

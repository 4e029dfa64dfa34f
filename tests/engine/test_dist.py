"""``dist.run_entry`` tears down only the process group its own call created."""

from __future__ import annotations

import sys

import pytest
import torch.distributed as tdist

from avion_ds.config import ConfigError
from avion_ds.distributed import dist
from tests.helpers import run_process


def test_a_group_that_existed_before_the_entry_is_left_alone(one_rank: None) -> None:
    dist.init()  # as a caller embedding us (or an earlier in-process test) would leave it
    assert dist.run_entry("t", lambda: 3, {}) == 3
    assert tdist.is_initialized()

    def bad() -> int:
        raise ConfigError("optim.lr: nan")

    assert dist.run_entry("t", bad, {ConfigError: 2}) == 2
    assert tdist.is_initialized()  # a later DeepSpeed engine in this process still finds its groups


@pytest.mark.multiprocess
def test_a_group_the_entry_created_is_torn_down_with_its_code() -> None:
    code = (
        "import sys; from avion_ds.distributed import dist\n"
        "def body():\n    dist.init(); return 5\n"
        "dist.run_entry('t', body, {})\n"
        "print('not reached'); sys.exit(0)\n"
    )
    proc = run_process([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "not reached" not in proc.stdout

"""Two CPU ranks leave no DeepSpeed shm all-reduce workspace behind in /dev/shm (deepspeed 0.19.8 leaks 64 MiB/rank)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.helpers import free_port, launch

pytestmark = pytest.mark.multiprocess

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    from avion_ds.distributed import dist
    rank, world, _ = dist.init()
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce_sum(t)  # the collective still works after the names are gone
    assert t.tolist() == [3.0] * 4, t
    gone = not os.path.exists(dist.shm_buffer_path(rank))
    print(f"rank {rank} unlinked {gone}", flush=True)
    dist.shutdown(0)
""")


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_two_ranks_leave_no_shm_files(tmp_path: Path) -> None:
    script = tmp_path / "shm_job.py"
    script.write_text(SCRIPT)
    port = free_port()
    pattern = f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"  # the deepspeed launcher sets LOCAL_SIZE
    r = launch([], launcher="deepspeed", script_path=script, port=port, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "rank 0 unlinked True" in r.stdout and "rank 1 unlinked True" in r.stdout, r.stdout
    left = sorted(p.name for p in Path("/dev/shm").glob(pattern))
    assert left == [], f"DeepSpeed shm workspaces left behind: {left}"

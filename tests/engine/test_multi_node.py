"""Two "nodes" on this machine through launch/multi_node.sh in no-ssh mode (`deepspeed --hostfile H
--no_ssh --node_rank N --master_addr 127.0.0.1`): ZeRO-3 training writes checkpoints, node 1 is
killed (-9), node 0 gives up after the short process-group timeout instead of hanging, both are
relaunched with the same command and resume from the newest complete checkpoint to the end.
3-clip val set, in-process decoding, no TensorBoard: the launch, kill and resume are the subject."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from avion_ds.engine.run_checkpoints import complete_tags
from tests.helpers import QUICK_DATA, REPO, engine_env, free_port, losses, write_recipe

pytestmark = pytest.mark.multiprocess


def _node(rank: int, recipe: Path, hostfile: Path, port: int, log: Path) -> subprocess.Popen:
    env = engine_env(
        NODE_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HOSTFILE=str(hostfile),
        DS_ACCELERATOR="cpu",
        AVION_DS_PG_TIMEOUT_S="20",
        SLURM_NODEID=None,
    )
    return subprocess.Popen(
        ["bash", str(REPO / "launch" / "multi_node.sh"), str(recipe), str(REPO / "ds_configs" / "zero3.json")],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.timeout(600)
def test_two_nodes_no_ssh_kill_and_resume(tiny_epic_quick: dict, tmp_path: Path) -> None:
    tiny_epic = tiny_epic_quick
    run = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_epic,
        run,
        checkpoint={"every_steps": 1, "keep_last": 20},
        eval={"every_epochs": 5},
        data=QUICK_DATA,
        logging={"tensorboard": False, "log_every": 1, "progress": False},
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")  # a hostfile cannot repeat a host name

    port = free_port()
    nodes = [_node(r, recipe, hostfile, port, tmp_path / f"first{r}.log") for r in (0, 1)]
    deadline = time.time() + 240
    while not complete_tags(run) and time.time() < deadline and nodes[0].poll() is None:
        time.sleep(0.2)
    assert complete_tags(run), (tmp_path / "first0.log").read_text()[-3000:]
    os.killpg(nodes[1].pid, signal.SIGKILL)  # node 1 dies (launcher and its rank)
    nodes[1].wait()
    t0 = time.time()
    code = nodes[0].wait(timeout=120)  # bounded by AVION_DS_PG_TIMEOUT_S, never the 30 min default
    first0 = (tmp_path / "first0.log").read_text()
    assert code != 0 and time.time() - t0 < 120, first0[-3000:]
    done = complete_tags(run)
    step = int(done[-1].split("_")[1])
    total = 2 * ((tiny_epic["num_train"] // 2) // 4)  # 2 epochs, drop_last over 2 ranks, micro 4
    assert step < total  # really interrupted

    port = free_port()
    nodes = [_node(r, recipe, hostfile, port, tmp_path / f"second{r}.log") for r in (0, 1)]
    codes = [p.wait(timeout=300) for p in nodes]
    second0 = (tmp_path / "second0.log").read_text()
    assert codes == [0, 0], second0[-3000:] + (tmp_path / "second1.log").read_text()[-2000:]
    assert f"resumed from {done[-1]}" in second0
    assert "world 2 | ZeRO-3" in second0
    assert max(losses(run)) == total

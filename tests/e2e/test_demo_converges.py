"""`bash launch/demo.sh` as the README runs it, full length: it must still converge (verb, noun and action
top-1 >= 95 on the 96 validation clips).

The bar is the demo's robustness margin, not this machine's number: in 8 runs (training seeds 0-4 and
synthetic data seeds 0, 1, 2) its recipe was at 100 from epoch 30 of 50 on (BENCHMARKS.md), so a CPU that
rounds differently still clears 95, and a change that slows learning (recipe, model, data, optimizer) fails
here instead of on a user's machine.
About 2.5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers import REPO, engine_env, free_port, run_process

pytestmark = pytest.mark.multiprocess

BAR = 95.0  # top-1 in percent, for verb, noun and action
PRINTED = re.compile(r"^(verb|noun|action) +top-1 +([0-9.]+)%", re.MULTILINE)


def test_demo_reaches_95_top1(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = engine_env(DEMO_DIR=str(out), MASTER_PORT=str(free_port()))
    proc = run_process(["bash", str(REPO / "launch" / "demo.sh")], timeout=900, env=env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"launch/demo.sh exited {proc.returncode}:\n{log[-4000:]}"
    printed = {head: float(value) for head, value in PRINTED.findall(log)}
    assert set(printed) == {"verb", "noun", "action"}, log[-3000:]
    metrics = json.loads((out / "run" / "eval_metrics.json").read_text())["metrics"]
    for head in ("verb", "noun", "action"):
        assert metrics[f"{head}_top1"] == pytest.approx(printed[head], abs=0.01), head
    low = {head: value for head, value in printed.items() if value < BAR}
    assert not low, f"the demo no longer converges: top-1 below {BAR} for {low}:\n{log[-3000:]}"
    assert (out / "model.safetensors").is_file()

"""Activation checkpointing (both impls, the selective policy) under ZeRO-3, the selective policy
under ZeRO 0-2: same training trajectory as without."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import engine_env, free_port, launch


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_zero3_checkpointing_matches_plain():
    pytest.importorskip("deepspeed")
    script = Path(__file__).with_name("zero3_ckpt_script.py")
    proc = launch(
        [], nprocs=1, launcher="python", script_path=script, timeout=280, env=engine_env(MASTER_PORT=str(free_port()))
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    result = json.loads(line[len("RESULT ") :])
    plain = result["None"]
    assert plain[0] > 1e-3 and plain[0] != plain[-1]  # a real, changing loss
    for impl in ("torch", "deepspeed", "selective", "selective@0", "selective@1", "selective@2"):
        assert result[impl] == pytest.approx(plain, rel=1e-6, abs=1e-9), impl

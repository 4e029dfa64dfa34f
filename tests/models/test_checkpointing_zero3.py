"""Activation checkpointing (both impls) under ZeRO-3: same training trajectory as without."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from avion_ds.engine.dist import free_port


@pytest.mark.timeout(300)
def test_zero3_checkpointing_matches_plain():
    pytest.importorskip("deepspeed")
    env = dict(os.environ, MASTER_PORT=str(free_port()))
    env.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/avion_torch_ext")
    script = Path(__file__).with_name("zero3_ckpt_script.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=280, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    result = json.loads(line[len("RESULT "):])
    plain = result["None"]
    assert plain[0] > 1e-3 and plain[0] != plain[-1]  # a real, changing loss
    for impl in ("torch", "deepspeed"):
        assert result[impl] == pytest.approx(plain, rel=1e-6, abs=1e-9), impl

"""ZeRO-3 parameter-offload inference keeps only a window of the model resident during forward:
the peak count of gathered parameter elements stays within max-live + prefetch bucket (or the
largest single module, which DeepSpeed always fetches whole), grows with the setting, and is well
below the model size for small settings."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import run_process

pytestmark = pytest.mark.multiprocess
CODE = (
    "import json, sys; from avion_ds.memory.offload import resident_peaks; "
    "print('RESULT ' + json.dumps(resident_peaks('vit_test_small', 8, 64, [20000, 100000, 1000000])), flush=True); "
    "import os; os._exit(0)"
)


@pytest.mark.timeout(240)
def test_resident_parameters_bounded_by_max_live_plus_prefetch() -> None:
    proc = run_process([sys.executable, "-c", CODE], timeout=220)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    rows = json.loads(line[7:])
    total = rows[0]["params"]
    assert total > 400_000
    for r in rows:
        bound = max(r["max_live_parameters"] + r["prefetch_bucket_size"], r["largest_module"])
        assert 0 < r["peak_resident"] <= bound, r
    assert rows[0]["peak_resident"] < 0.25 * total  # a small window, not the model
    assert [r["peak_resident"] for r in rows] == sorted(r["peak_resident"] for r in rows)

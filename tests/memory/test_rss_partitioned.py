"""Per-rank host memory of building + loading a model with ZeRO-3 on 2 CPU ranks (CI-sized).

ViT-B (86.5M params, 330 MiB fp32) built under ``zero.Init`` and loaded from a safetensors file
module by module: each rank's peak RSS above its baseline must stay <= 0.65x of the full fp32
model (a full build is 1.0x; a full build then ``load_weights`` of the whole state dict peaks
at about 2.0x). The 0.6x target is the large models' (ViT-g 0.52x, ViT-H 0.53x: BENCHMARKS.md); on
ViT-B the per-rank fixed cost is a larger share and the peak measured 0.574-0.604x, with the other
pytest-xdist worker busy beside it, so the bound here leaves that noise room and still fails both
unpartitioned cases.
``--no-init``: deepspeed.initialize is not part of what this test bounds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import engine_env, launch

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(300)
def test_build_and_load_peak_rss_per_rank_below_0_65x(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from bench.rss import write_random_weights

    weights = write_random_weights("vit_base_patch16_224", tmp_path / "vitb.safetensors")
    out = tmp_path / "rss.json"
    proc = launch(
        ["--model", "vit_base_patch16_224", "--mode", "after", "--pretrained", weights, "--no-init", "--out", out],
        launcher="torchrun",
        module="bench.rss",
        timeout=280,
        env=engine_env(MALLOC_MMAP_THRESHOLD_=None),
    )  # the code must set what it needs itself
    assert proc.returncode == 0 and out.is_file(), f"rc={proc.returncode}\n{proc.stderr[-4000:]}"
    r = json.loads(out.read_text())
    fp32 = r["fp32_bytes"]
    assert r["params"] > 80_000_000
    for rank in r["ranks"]:
        st = rank["stages"]
        assert st["load"]["report"] == "format=avion_ds"  # every key loaded
        peak = max(
            st["build"]["peak_total"],
            st["load"]["peak_total"],
            st["build"]["peak_anon"] + st["build"]["peak_file"],
            st["load"]["peak_anon"] + st["load"]["peak_file"],
        )
        assert peak <= 0.65 * fp32, f"rank {rank['rank']}: peak {peak / fp32:.3f}x of fp32 bytes: {st}"
        assert st["build"]["now_total"] >= 0.45 * fp32  # the measurement saw the rank's half of the model

"""`data.decoder: auto` in training: the probed backend is logged, recorded in the run dir, kept on resume.
A 3-clip val set and in-process decoding (``tiny_epic_quick``, ``QUICK_DATA``): the runs' evaluation and the
decode helper are other tests' subject."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import QUICK_DATA, REPO, launch, write_recipe

pytestmark = pytest.mark.multiprocess


def _train(recipe: Path, steps: int) -> subprocess.CompletedProcess:
    return launch(
        [
            "--config",
            recipe,
            "--deepspeed_config",
            REPO / "ds_configs" / "zero0.json",
            "--exit-after-steps",
            str(steps),
        ],
        nprocs=1,
        launcher="python",
        timeout=300,
    )


def test_auto_decoder_is_recorded_and_kept_on_resume(tiny_epic_quick: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", tiny_epic_quick, run, data=QUICK_DATA)
    recipe.write_text(recipe.read_text().replace("decoder: decord", "decoder: auto"))
    first = _train(recipe, 1)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    rec = json.loads((run / "decoder.json").read_text())
    assert f"data.decoder=auto -> {rec['decoder']} (probe on" in first.stdout
    other = next(b for b in ("pyav", "decord", "torchcodec") if b != rec["decoder"])
    (run / "decoder.json").write_text(json.dumps({**rec, "decoder": other}))  # as if the probe had chosen it
    second = _train(recipe, 2)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert f"data.decoder=auto -> {other} (recorded in {run / 'decoder.json'}" in second.stdout
    assert "resumed from" in second.stdout

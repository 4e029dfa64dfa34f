"""``optim.weight_decay_end`` above ``optim.weight_decay`` is allowed (a rising cosine, docs/training.md) and said
in the start-up summary line; a falling or absent schedule is said as such."""

from __future__ import annotations

import pytest

from avion_ds.config import recipe_from_dict
from tests.test_bad_input_table import ZERO2, files, no_process_group  # noqa: F401 - files is a fixture


def _dry_run_line(files: dict, capsys: pytest.CaptureFixture, *sets: str) -> str:  # noqa: F811
    from avion_ds.cli import train as train_cli

    argv = ["--config", str(files["recipes"]["cls"]), "--deepspeed_config", str(ZERO2), "--dry-run"]
    code = train_cli.main([*argv, *[x for s in sets for x in ("--set", s)]])
    out, err = capsys.readouterr()
    assert code == 0, err
    return next(x for x in out.splitlines() if x.startswith("# avion-ds train --dry-run"))


def test_rising_weight_decay_is_said_in_the_summary_line(
    files: dict,  # noqa: F811
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_process_group(monkeypatch)
    line = _dry_run_line(files, capsys, "optim.weight_decay=0.05", "optim.weight_decay_end=0.2")
    assert "weight decay 0.05 -> 0.2 (rising: optim.weight_decay_end > optim.weight_decay" in line, line
    line = _dry_run_line(files, capsys, "optim.weight_decay=0.05", "optim.weight_decay_end=0.01")
    assert "weight decay 0.05 -> 0.01 (cosine)" in line and "rising" not in line, line


def test_weight_decay_text() -> None:
    from avion_ds.cli.train import weight_decay_text

    recipe = recipe_from_dict({"optim": {"weight_decay": 0.05}})
    assert weight_decay_text(recipe) == "weight decay 0.05"
    recipe.optim.weight_decay_end = 0.3
    assert weight_decay_text(recipe).startswith("weight decay 0.05 -> 0.3 (rising")

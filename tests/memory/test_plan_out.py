"""`avion-ds plan` without --out writes nothing (it printed plan.json + plan.overrides.yaml into the
current directory unasked): the config and the overrides are printed; --out writes both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avion_ds.cli import plan as plan_cli

ARGS = ["--model", "vit_test_tiny", "--frames", "4", "--size", "32", "--gpu-mem", "8GiB"]


def test_plan_without_out_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert plan_cli.main(ARGS) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert "nothing written (--out PLAN.json writes the config and the overrides)" in out
    printed = out.split("clips/s\n", 1)[1].split("\nrecipe overrides:")[0]
    assert "zero_optimization" in json.loads(printed)
    assert "--deepspeed_config PLAN.json" in out


def test_plan_with_out_writes_both(tmp_path: Path, capsys) -> None:
    assert plan_cli.main([*ARGS, "--out", str(tmp_path / "p.json")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "p.overrides.yaml"]
    assert f"wrote {tmp_path / 'p.json'}" in capsys.readouterr().out

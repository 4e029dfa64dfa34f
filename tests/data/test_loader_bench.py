"""`avion-ds bench-loader RECIPE`: clips/s per worker and workers needed for a target."""

from __future__ import annotations

import math
import re

import yaml

from avion_ds.cli import main as cli
from avion_ds.data.decode.loader_bench import workers_needed


def test_workers_needed_is_the_smallest_sufficient_count() -> None:
    for target, per in ((10, 3.0), (9, 3.0), (0.5, 2.0), (40, 7.3)):
        brute = next(n for n in range(1, 100) if n * per >= target)
        assert workers_needed(target, per) == brute


def test_bench_loader_prints_rates_and_workers(epic_cfg, tmp_path, capsys) -> None:
    recipe = tmp_path / "r.yaml"
    data = {k: getattr(epic_cfg, k) for k in ("dataset", "root", "train_csv", "val_csv", "num_frames", "size")}
    recipe.write_text(
        yaml.safe_dump(
            {"model": {"heads": {"verb": 8, "noun": 8}}, "data": {**data, "decoder": "auto", "decode_timeout_s": 0.0}}
        )
    )
    rc = cli(
        [
            "bench-loader",
            str(recipe),
            "--workers",
            "1",
            "--batch",
            "2",
            "--batches",
            "2",
            "--clips",
            "2",
            "--target",
            "1000",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "data.decoder=auto -> " in out
    per_worker = float(re.search(r"^\s+1\s+[\d.]+\s+([\d.]+)$", out, re.MULTILINE).group(1))
    n = int(re.search(r"target 1000 clips/s per GPU -> (\d+) workers", out).group(1))
    assert n == math.ceil(1000 / per_worker) or abs(n - 1000 / per_worker) < 1.01  # printed rate is rounded


def test_bench_loader_bad_input_is_one_line_exit_2(tmp_path, capsys) -> None:
    assert cli(["bench-loader", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "recipe file not found" in err and "\n" not in err
    assert cli(["bench-loader", str(tmp_path / "missing.yaml"), "--workers", "0"]) == 2
    assert "--workers '0'" in capsys.readouterr().err

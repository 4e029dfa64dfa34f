"""`avion-ds check RECIPE_OR_DATA`: integrity pass over a prepared dataset; writes ``quarantine.tsv``
(the checks: :mod:`avion_ds.data.prep.check`)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from avion_ds.cli.args import Parser, add_positional_alias, alias_positional
from avion_ds.cli.plugins import add_plugin_option, import_plugins
from avion_ds.config import ConfigError, add_override_option
from avion_ds.data.datasets.quarantine import QUARANTINE_NAME, write_quarantine
from avion_ds.data.prep.check import SUMMARY_NAME, CheckReport, check_files, check_rows
from avion_ds.data.prep.manifest import MANIFEST_NAME
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.tasks import load_recipe


def run_check(target: str, overrides: list[str], full: bool, workers: int, out: str | None) -> CheckReport:
    """Check a recipe's dataset (annotations + files) or a chunk directory (files); write the outputs."""
    t0 = time.perf_counter()
    path = Path(target)
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            raise ConfigError(f"{path}: no {MANIFEST_NAME} (pass a recipe YAML, or a directory made by avion-ds chunk)")
        cfg = load_recipe(None, ["data.dataset=kinetics", f"data.root={path}", *overrides]).data
        report = CheckReport(str(path), "full" if full else "sampled")
        check_files(cfg, load_manifest(path).values(), full, workers, report)
    elif path.is_file():
        recipe = load_recipe(path, overrides)
        cfg = recipe.data
        if cfg.shards:
            raise ConfigError(
                f"data.shards={cfg.shards}: avion-ds check reads chunk trees; check the tree before `avion-ds pack` "
                "(shards carry each chunk's sha256, verified as it is read)"
            )
        if not cfg.root or not Path(cfg.root).is_dir():
            raise ConfigError(f"data.root: directory not found: {cfg.root!r}")
        report = CheckReport(cfg.root, "full" if full else "sampled")
        used = check_rows(cfg, report, recipe.sections)
        if cfg.chunked:
            check_files(cfg, load_manifest(cfg.root).values(), full, workers, report)
        else:
            check_files(cfg, used, full, workers, report)
    else:
        raise ConfigError(f"{path}: neither a recipe file nor a chunk directory")
    report.seconds = time.perf_counter() - t0
    report.quarantine_setting = cfg.quarantine
    if cfg.quarantine not in ("", "none"):
        report.training_reads = Path(cfg.root) / QUARANTINE_NAME if cfg.quarantine == "auto" else Path(cfg.quarantine)
    out_dir = Path(out) if out else Path(report.root)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_quarantine(out_dir / QUARANTINE_NAME, report.quarantine)
    (out_dir / SUMMARY_NAME).write_text(json.dumps(report.summary(), indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    """``avion-ds check --config RECIPE_OR_DATA``: exit 0 clean, 1 something quarantined, 2 bad input."""
    p = Parser(prog="avion-ds check", description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", dest="target", default=None, help="a recipe YAML (annotations + videos) or a chunk directory"
    )
    add_positional_alias(p, "--config", "target")
    add_override_option(p, "data.root=/data/k400/chunks")
    p.add_argument("--full", action="store_true", help="decode and count every frame (default: first/middle/last)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="parallel processes")
    p.add_argument("--out", default=None, help="where quarantine.tsv and check_summary.json go (default: data root)")
    add_plugin_option(p)
    a = p.parse_args(argv)
    alias_positional(a, "--config", "target", "avion-ds check", note=Path(a.target_positional or "").is_file())
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    try:
        import_plugins(a.plugins)
        report = run_check(a.target, a.overrides, a.full, a.workers, a.out)
    except (ConfigError, OSError, ValueError) as e:
        print(f"avion-ds check: error: {e}", file=sys.stderr)
        return 2
    print(report)
    where = Path(a.out) if a.out else Path(report.root)
    if report.quarantine:
        print(
            f"quarantine list: {where / QUARANTINE_NAME} ({_training_note(report, where / QUARANTINE_NAME)}; "
            f"summary {where / SUMMARY_NAME})"
        )
        return 1
    return 0


def _training_note(report: CheckReport, written: Path) -> str:
    """Whether training reads the list just written (``data.quarantine`` decides which file it reads)."""
    reads = report.training_reads
    if reads is not None and reads.resolve() == written.resolve():
        return "training skips these rows"
    now = (
        f"training reads {reads} (data.quarantine: {report.quarantine_setting})"
        if reads is not None
        else "training reads no quarantine list (data.quarantine: none)"
    )
    return f"{now}, not this file: to skip these rows, train with --set data.quarantine={written}"


if __name__ == "__main__":
    sys.exit(main())

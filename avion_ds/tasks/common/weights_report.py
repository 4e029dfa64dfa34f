"""Make pretrained loading visible: one summary line, ``pretrained_report.json``, and a coverage check.

A checkpoint that barely maps onto the model (wrong format guess, other architecture) would
otherwise fine-tune from scratch without a word. ``load_and_report`` loads the recipe's weights,
prints one line on rank 0 (matched / missing / unexpected / resized keys, the first missing
backbone keys), writes the full report to the run directory, and with ``model.pretrained_strict``
(default) refuses to go on when less than ``MIN_BACKBONE_MATCH`` of the backbone's parameters
(everything but the classifier heads) were loaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from avion_ds.config import ConfigError, Recipe
from avion_ds.data.datasets.build import dataset_spec
from avion_ds.models import LoadReport
from avion_ds.models.partition import full_numel
from avion_ds.models.weights.loading import MIN_BACKBONE_MATCH
from avion_ds.models.weights.sharded import load_pretrained_sharded

REPORT_NAME = "pretrained_report.json"
_HEADS = ("head.", "heads.")


def maps_kinetics710_head(recipe: Recipe) -> bool:
    """Whether the recipe's ``model.pretrained`` load maps a Kinetics-710 head onto its Kinetics-400 / 600 /
    700 head (``model.head_label_map: auto`` and ``data.dataset: kinetics``, as VideoMAE V2's fine-tuning)."""
    return recipe.model.head_label_map == "auto" and dataset_spec(recipe.data).maps_kinetics710_head


def backbone_coverage(model: nn.Module, report: LoadReport) -> tuple[int, int, list[str]]:
    """(matched numel, total numel, missing names) over the model's non-head parameters."""
    missing = set(report.missing)
    matched = total = 0
    absent: list[str] = []
    for name, p in model.named_parameters():
        if name.startswith(_HEADS):
            continue
        total += full_numel(p)
        if name in missing:
            absent.append(name)
        else:
            matched += full_numel(p)
    return matched, total, absent


def summary_line(source: str, report: LoadReport, matched: int, total: int, absent: list[str]) -> str:
    """One line: what was loaded from where, and the decisions the load took (e.g. what of a dual
    encoder was dropped)."""
    frac = matched / total if total else 1.0
    first = f"; first missing backbone keys: {', '.join(absent[:4])}" if absent else ""
    notes = f" ({'; '.join(report.notes)})" if report.notes else ""
    return (
        f"pretrained {source}: format {report.format}, backbone {100 * frac:.1f}% of parameters matched "
        f"({matched:,}/{total:,}) | missing {len(report.missing)}, unexpected {len(report.unexpected)}, "
        f"resized {len(report.resized)}, dropped {len(report.dropped)}{first}{notes}"
    )


def load_and_report(
    model: nn.Module,
    source: str,
    *,
    strict: bool,
    trust: bool,
    run_dir: Path | None,
    is_main: bool,
    log: Callable[[str], None] = print,
    kinetics_head: bool = False,
) -> LoadReport:
    """Load ``source`` into ``model``; rank 0 logs the summary and writes ``run_dir/pretrained_report.json``.

    Raises ConfigError (one line, exit 2) for an unreadable / untrusted file, and under ``strict`` when
    less than ``MIN_BACKBONE_MATCH`` of the backbone parameters were matched. ``kinetics_head``: a 710-row
    (Kinetics-710) head is mapped onto the model's Kinetics-400/600/700 head (:func:`maps_kinetics710_head`).
    """
    try:
        # plain models: load_pretrained; the coverage is checked (and reported) below, once
        report = load_pretrained_sharded(model, source, trust=trust, coverage_check=False, kinetics_head=kinetics_head)
    except (OSError, ValueError) as e:  # not found, unreadable, untrusted pickle, unknown format, bad shape
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"model.pretrained={source}: {msg}") from None
    matched, total, absent = backbone_coverage(model, report)
    frac = matched / total if total else 1.0
    if is_main:
        log(summary_line(source, report, matched, total, absent))
        if run_dir is not None:
            payload: dict[str, Any] = {
                "source": str(source),
                "format": report.format,
                "backbone_matched_fraction": frac,
                "backbone_matched_params": matched,
                "backbone_params": total,
                "missing": report.missing,
                "unexpected": report.unexpected,
                "resized": report.resized,
                "dropped": report.dropped,
                "skipped": report.skipped,
                "fresh": report.fresh,
                "remapped": report.remapped,
                "notes": report.notes,
                "strict": strict,
                "min_backbone_match": MIN_BACKBONE_MATCH,
            }
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / REPORT_NAME).write_text(json.dumps(payload, indent=2) + "\n")
    if strict and frac < MIN_BACKBONE_MATCH:
        raise ConfigError(
            f"model.pretrained={source}: only {100 * frac:.1f}% of the backbone parameters matched "
            f"(< {100 * MIN_BACKBONE_MATCH:.0f}%; first missing: {', '.join(absent[:3])}); wrong "
            "checkpoint for this model? Set model.pretrained_strict=false to train anyway"
        )
    return report

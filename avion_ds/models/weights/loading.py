"""The one weight-loading entry point: :func:`load_weights` reads any checkpoint the model families know
(:mod:`~avion_ds.models.weights.checkpoint`), loads it into a plain model or, shard by shard, into a ZeRO-3
partitioned one (:mod:`~avion_ds.models.weights.sharded`; which one is read from the model), and returns
the :class:`~avion_ds.models.weights.report.LoadReport` with its backbone coverage (defined there) and the
weights' normalisation. :func:`load_and_report` is a recipe's load: one line, ``pretrained_report.json``
and the coverage check as a one-line ConfigError.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from avion_ds.config import ConfigError
from avion_ds.config.normalization import mean_std_mismatch
from avion_ds.models.partition import is_partitioned_model, partitioned_construction
from avion_ds.models.weights.checkpoint import prepare_state_dict
from avion_ds.models.weights.report import MIN_BACKBONE_MATCH, LoadReport
from avion_ds.models.weights.sharded import load_partitioned

logger = logging.getLogger(__name__)

REPORT_NAME = "pretrained_report.json"  # the full report, written in the run directory


def load_weights(
    model: nn.Module,
    source: str | Path | dict,
    strict: bool = False,
    trust: bool = False,
    *,
    coverage_check: bool = True,
    kinetics_head: bool = False,
) -> LoadReport:
    """Load ``source`` (file, HF directory, run directory, or a (wrapped) state dict) into ``model`` in place.

    ``model``: a fine-tuning ``VideoViT`` (any format; a pretraining checkpoint gives its encoder), a
    ``VideoMAEPretrain`` (the pretraining layouts) or a ``VideoTextDualEncoder`` (CLIP / OpenCLIP / AVION),
    each through its own ``prepare_checkpoint``; built plainly or under ``zero.Init`` (then collective:
    every rank calls, rank 0 reads). ``strict=True`` raises listing missing / unexpected / dropped keys; a
    load covering less than ``MIN_BACKBONE_MATCH`` of the backbone (:mod:`~avion_ds.models.weights.report`)
    is logged at ERROR level (``coverage_check=False``: a caller that reports coverage itself,
    :func:`load_and_report`). ``trust`` allows full unpickling of a file that pickles more than weights;
    ``kinetics_head``: a 710-row head becomes the model's Kinetics-400 / 600 / 700 rows by the label map
    (video ViT classifiers). Call before ``deepspeed.initialize``."""
    if is_partitioned_model(model):
        report = load_partitioned(model, source, trust, kinetics_head=kinetics_head)
    else:
        sd, report = prepare_state_dict(model, source, trust, kinetics_head=kinetics_head)
        result = model.load_state_dict(sd, strict=False)
        report.missing, report.unexpected = list(result.missing_keys), list(result.unexpected_keys)
    _finish(report, model)
    if strict and (report.missing or report.unexpected or report.dropped):
        raise ValueError(f"load_weights(strict=True) from {_name(source)}: {report.summary()}")
    if coverage_check and report.coverage < MIN_BACKBONE_MATCH:
        logger.error(
            "pretrained %s matched %.1f%% of %s's backbone parameters (%d of %d; below %.0f%%): %s",
            _name(source),
            100 * report.coverage,
            type(model).__name__,
            report.matched,
            report.total,
            100 * MIN_BACKBONE_MATCH,
            report.summary(),
        )
    return report


def _finish(report: LoadReport, model: nn.Module) -> None:
    """Sort the key lists (fresh keys are not missing), count the coverage, warn about a dropped timm table.

    A module with ``absent_is_fresh = True`` (RLT's run-length table, zero at start: the model without it
    computes the same) is fresh, not missing, when the checkpoint lacks its parameters."""
    optional = tuple(f"{name}." for name, m in model.named_modules() if getattr(m, "absent_is_fresh", False))
    if optional:
        report.fresh += [k for k in report.missing if k.startswith(optional) and k not in report.fresh]
    report.missing = sorted(set(report.missing) - set(report.fresh))
    report.unexpected = sorted(report.unexpected)
    for keys in (report.resized, report.dropped, report.remapped):
        keys.sort()
    report.count_coverage(model)
    if (
        report.format == "timm"
        and getattr(getattr(model, "arch", None), "pos_embed", None) == "sincos"
        and "pos_embed" in report.unexpected
    ):
        logger.warning(
            "timm checkpoint has a learned pos_embed but the model uses fixed sin-cos; "
            "create the model with pos_embed='learned' to keep it"
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
    mean_std: str | None = None,
    key: str = "model.pretrained",
) -> LoadReport:
    """A recipe's ``model.pretrained`` load: ``load_weights``, then on rank 0 the report's one line (and,
    when ``mean_std`` (the recipe's ``data.mean_std``) differs from the weights' own, one more line saying
    so) and ``run_dir/pretrained_report.json``. ``key``: the recipe key the error lines name (another
    weight file a task reads, e.g. ``umt.teacher``).

    Raises ConfigError (one line, exit 2) for an unreadable / untrusted file, and under ``strict`` when the
    backbone coverage is below ``MIN_BACKBONE_MATCH``.
    """
    try:
        report = load_weights(model, source, trust=trust, coverage_check=False, kinetics_head=kinetics_head)
    except (OSError, ValueError) as e:  # not found, unreadable, untrusted pickle, unknown format, bad shape
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key}={source}: {msg}") from None
    if is_main:
        log(report.line(source))
        mismatch = mean_std_mismatch(mean_std, report.mean_std) if mean_std is not None else None
        if mismatch is not None:
            log(mismatch)
        if run_dir is not None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / REPORT_NAME).write_text(json.dumps(report.payload(source, strict), indent=2) + "\n")
    if strict and report.coverage < MIN_BACKBONE_MATCH:
        raise ConfigError(
            f"{key}={source}: only {100 * report.coverage:.1f}% of the backbone parameters matched "
            f"(< {100 * MIN_BACKBONE_MATCH:.0f}%; first missing: {', '.join(report.absent[:3])}); wrong "
            "checkpoint for this model? Set model.pretrained_strict=false to train anyway"
        )
    return report


def build_partitioned(
    factory: Callable[[], nn.Module],
    ds_config: dict[str, Any] | None,
    pretrained: str | Path | dict | None = None,
    strict: bool = False,
) -> nn.Module:
    """``factory()`` under ``zero.Init`` when ``ds_config`` is ZeRO-3 (plainly otherwise), then
    ``pretrained`` loaded module by module. The factory must not load weights itself: reading a
    checkpoint inside ``zero.Init`` would go through its patched tensor constructors."""
    with partitioned_construction(ds_config):
        model = factory()
    if pretrained is not None and pretrained != "":
        report = load_weights(model, pretrained, strict=strict)
        logger.info("%s: loaded %s", type(model).__name__, report.summary())
    return model


def _name(source: Any) -> str:
    return "a state dict" if isinstance(source, dict) else str(source)

"""The load report every weight adapter fills, and the one definition of a load's backbone coverage.

Coverage: of the model's parameter elements the checkpoint is expected to fill (logical sizes, also
under ZeRO-3), the fraction it filled. Not expected, so left out of both counts: the classifier heads
(top-level ``head.`` / ``heads.``) and the ``fresh`` parameters, those the adapter starts anew on purpose
because the format holds none for them or the recipe asks so (a new projection, a temporal embedding a
CLIP checkpoint lacks). Every other parameter the load left unfilled is ``missing`` and lowers the
coverage. A load below ``MIN_BACKBONE_MATCH`` is an error: logged by ``load_weights``, refused by a
recipe's load under ``model.pretrained_strict`` (:mod:`avion_ds.models.weights.loading`).

Normalisation: ``mean_std`` names the statistics the weights were trained with, as a ``data.mean_std``
value (:data:`avion_ds.config.normalization.MEAN_STD`), declared by each format (``FORMAT_MEAN_STD`` in
the family's ``weights`` module); None where the format does not say (our own files, timm's images).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from avion_ds.config.normalization import describe_mean_std
from avion_ds.models.partition import full_numel

MIN_BACKBONE_MATCH = 0.9  # a load below this fraction of the backbone's parameters is an error
HEADS = ("head.", "heads.")  # classifier heads: outside the backbone coverage


@dataclass
class LoadReport:
    """What a load did: keys the model lacked / the checkpoint lacked / resized, the backbone coverage
    (``matched`` of ``total`` parameter elements; see the module doc) and the weights' normalisation."""

    format: str
    missing: list[str] = field(default_factory=list)  # model keys not found in the checkpoint
    unexpected: list[str] = field(default_factory=list)  # checkpoint keys the model has no use for
    resized: list[str] = field(default_factory=list)  # loaded after interpolation / inflation
    dropped: list[str] = field(default_factory=list)  # shape mismatch we cannot resize (e.g. head)
    skipped: list[str] = field(default_factory=list)  # checkpoint keys left out on purpose (fresh projection)
    remapped: list[str] = field(default_factory=list)  # head rows picked by a label map (Kinetics-710 -> 400/...)
    fresh: list[str] = field(default_factory=list)  # model keys initialised anew on purpose (not "missing")
    notes: list[str] = field(default_factory=list)  # decisions the load took, in words
    mean_std: str | None = None  # the weights' own normalisation (a data.mean_std value); None: not stated
    matched: int = 0  # backbone parameter elements loaded (set by ``count_coverage``)
    total: int = 0  # backbone parameter elements of the model
    absent: list[str] = field(default_factory=list)  # missing backbone parameter names

    @property
    def coverage(self) -> float:
        """The loaded fraction of the backbone's parameter elements (1.0 for a model without one)."""
        return self.matched / self.total if self.total else 1.0

    def count_coverage(self, model: nn.Module) -> None:
        """Fill ``matched`` / ``total`` / ``absent`` from ``model``'s parameters, ``missing`` and ``fresh``
        (the module doc's definition)."""
        missing, fresh = set(self.missing), set(self.fresh)
        self.matched = self.total = 0
        self.absent = []
        for name, p in model.named_parameters():
            if name.startswith(HEADS) or name in fresh:
                continue
            self.total += full_numel(p)
            if name in missing:
                self.absent.append(name)
            else:
                self.matched += full_numel(p)

    def summary(self) -> str:
        """Every non-empty key list (first six names), the normalisation and the notes, on one line."""

        def short(keys: list[str]) -> str:
            return ", ".join(keys[:6]) + (f", ... (+{len(keys) - 6})" if len(keys) > 6 else "")

        parts = [f"format={self.format}"]
        for name in ("missing", "unexpected", "resized", "dropped", "skipped", "fresh", "remapped"):
            keys = getattr(self, name)
            if keys:
                parts.append(f"{name}={len(keys)} [{short(keys)}]")
        if self.mean_std is not None:
            parts.append(f"mean_std={self.mean_std}")
        return " ".join(parts + [f"({n})" for n in self.notes])

    def line(self, source: str) -> str:
        """The start-up line: what was loaded from where, the coverage, the weights' normalisation and
        the decisions the load took (e.g. what of a dual encoder was dropped)."""
        first = f"; first missing backbone keys: {', '.join(self.absent[:4])}" if self.absent else ""
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        return (
            f"pretrained {source}: format {self.format}, backbone {100 * self.coverage:.1f}% of parameters "
            f"matched ({self.matched:,}/{self.total:,}) | missing {len(self.missing)}, unexpected "
            f"{len(self.unexpected)}, resized {len(self.resized)}, dropped {len(self.dropped)}{first} | "
            f"{describe_mean_std(self.mean_std)}{notes}"
        )

    def payload(self, source: str, strict: bool) -> dict[str, Any]:
        """The JSON written beside a run (``pretrained_report.json``)."""
        return {
            "source": str(source),
            "format": self.format,
            "mean_std": self.mean_std,
            "backbone_matched_fraction": self.coverage,
            "backbone_matched_params": self.matched,
            "backbone_params": self.total,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "resized": self.resized,
            "dropped": self.dropped,
            "skipped": self.skipped,
            "fresh": self.fresh,
            "remapped": self.remapped,
            "notes": self.notes,
            "strict": strict,
            "min_backbone_match": MIN_BACKBONE_MATCH,
        }

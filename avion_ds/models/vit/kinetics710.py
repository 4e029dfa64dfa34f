"""Kinetics-710 classifier heads onto Kinetics-400 / 600 / 700: VideoMAE V2's label maps.

VideoMAE V2 fine-tunes its K710 checkpoints on Kinetics by keeping the rows of the 710-way head that its
``misc/label_710to{400,600,700}.json`` name (``run_class_finetuning.py``:
``checkpoint_model[k] = checkpoint_model[k][label_map]``); the maps ship in ``label_maps/`` (source, commit
and licence in its README).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from avion_ds.models.weights.report import LoadReport

K710 = 710  # classes of Kinetics-710 (VideoMAE V2's supervised post-pretraining)
LABEL_MAPS = Path(__file__).with_name("label_maps")  # label_710to{400,600,700}.json, from VideoMAE V2


def k710_label_map(classes: int) -> list[int] | None:
    """For Kinetics-``classes`` (400 / 600 / 700), the Kinetics-710 row of each of its classes (VideoMAE V2's
    ``misc/label_710to<classes>.json``); None for other class counts."""
    path = LABEL_MAPS / f"label_710to{classes}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def remap_k710(k: str, v: torch.Tensor, want: torch.Size, report: LoadReport) -> torch.Tensor | None:
    """A Kinetics-710 head's rows for a Kinetics-400 / 600 / 700 head (None: no map for this shape)."""
    rows = k710_label_map(int(want[0])) if v.shape[0] == K710 and v.shape[1:] == want[1:] else None
    if rows is None:
        return None
    report.remapped.append(k)
    note = f"Kinetics-710 head rows mapped onto Kinetics-{want[0]} by label_710to{want[0]}.json (VideoMAE V2)"
    if note not in report.notes:
        report.notes.append(note)
    return v[rows]

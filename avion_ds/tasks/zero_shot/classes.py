"""Zero-shot classifiers from text prompts (LaViLa's ``eval_zeroshot.py`` ``validate_zeroshot``) and the
metrics LaViLa reports with them.

Each class has one or more names; every name is put in every template (``zeroshot.templates``), the
prompts are embedded by the text tower and L2-normalised, averaged per class and normalised again: one
row of the classifier matrix. A clip's logits are the cosine similarities of its normalised video
embedding to the rows; with several views (temporal x spatial) LaViLa takes the maximum over the views
and a softmax (its list-of-clips branch), with one view the cosines themselves.

Class sets, read from the files as released:

- EPIC-100: ``verb`` and ``noun`` heads from ``EPIC_100_verb_classes.csv`` / ``EPIC_100_noun_classes.csv``
  (columns ``id``, ``key``; a key's ``-`` / ``_`` become spaces, a noun ``pan:dust`` reads ``dust pan``); the
  ``action`` head is LaViLa's: the string-sorted ``verb:noun`` pairs of the train + validation CSVs (AVION's
  map, 3806 classes on EPIC-100), each prompted with every distinct ``narration`` of that pair.
- EGTEA Gaze+ (``action_idx.txt``) and Charades-Ego (``Charades_v1_classes.txt``): the names
  :mod:`avion_ds.data.datasets.egocentric` reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from avion_ds.data.datasets.csv_rows import open_csv, parse_int
from avion_ds.data.datasets.epic import EPIC_CLASS_FILES, EPIC_REQUIRED, epic_class_files  # noqa: F401 - re-read here
from avion_ds.data.tokenizer import tokenize

TEMPLATE_SETS: dict[str, tuple[str, ...]] = {
    "lavila": ("#C C {}", "#C {}"),  # eval_zeroshot.py with --cls-use-template
    "plain": ("{}",),  # eval_zeroshot.py without it (the MODEL_ZOO commands)
}
EPIC_TRAIN = "EPIC_100_train.csv"


def resolve_templates(spec: str) -> tuple[str, ...]:
    """``zeroshot.templates``: a named set (lavila, plain) or ``|``-separated formats, each with one ``{}``."""
    if spec in TEMPLATE_SETS:
        return TEMPLATE_SETS[spec]
    formats = tuple(t.strip() for t in spec.split("|") if t.strip())
    bad = next((t for t in formats if t.count("{}") != 1 or "{" in t.replace("{}", "")), None)
    if not formats or bad is not None:
        raise ValueError(
            f"zeroshot.templates={spec!r}: expected {' or '.join(TEMPLATE_SETS)} or formats with one '{{}}' "
            f"each, separated by '|' (first bad: {bad!r})"
        )
    return formats


@dataclass
class ClassSet:
    """One zero-shot head: the names of each class (every name goes through every template)."""

    head: str
    names: list[list[str]]
    source: str
    report: dict[str, Any] = field(default_factory=dict)  # what the eval JSON adds for this head
    note: str = ""  # a start-up line about this head (printed once)

    def __len__(self) -> int:
        return len(self.names)


def epic_key_name(key: str, noun: bool) -> str:
    """An EPIC class key as words: ``turn-on`` -> ``turn on``; a noun ``pan:dust`` -> ``dust pan``."""
    parts = key.split(":")
    if noun:
        parts = parts[::-1]
    return " ".join(" ".join(parts).replace("-", " ").replace("_", " ").split())


def read_epic_classes(path: str | Path, noun: bool) -> list[str]:
    """Class names of an EPIC-100 class CSV (``id``, ``key``), in id order; ids must be 0..K-1."""
    p, rows = open_csv(path, ("id", "key"))
    ids = [parse_int(r["id"]) for _, r in rows]
    if not rows or sorted(i for i in ids if i is not None) != list(range(len(rows))):
        raise ValueError(f"{p}: expected ids 0..{len(rows) - 1} in column 'id' (EPIC-100 class file)")
    names = [""] * len(rows)
    for i, (_, r) in zip(ids, rows):
        names[int(i)] = epic_key_name(r["key"], noun)
    return names


def check_labels_fit(class_file: Path, head: str, count: int, val_csv: str | Path) -> None:
    """ValueError (one line: the class file, the largest ``{head}_class`` of ``val_csv`` and its line, the
    class count) when the validation labels use a class the file lacks: no prompt exists for it."""
    top, where = -1, 0
    for line, r in open_csv(val_csv, EPIC_REQUIRED)[1]:
        v = parse_int(r[f"{head}_class"])
        if v is not None and v > top:
            top, where = v, line
    if top >= count:
        raise ValueError(
            f"{class_file}: {count} {head} classes (ids 0..{count - 1}), but {val_csv}:{where} has {head}_class "
            f"{top} (the largest label); the class file must name every class the labels use"
        )


def epic_narration_files(train_csv: str, val_csv: str) -> list[Path]:
    """The CSVs whose (verb, noun) pairs make LaViLa's action classes: the EPIC train CSV (``data.train_csv``
    when it is one, else ``EPIC_100_train.csv`` / ``train.csv`` next to ``data.val_csv``) and ``data.val_csv``."""
    here = Path(val_csv).parent
    for candidate in (train_csv, here / EPIC_TRAIN, here / "train.csv"):
        p = Path(candidate) if candidate else None
        if p is not None and p.is_file() and p.suffix == ".csv" and p != Path(val_csv):
            try:
                open_csv(p, EPIC_REQUIRED + ("narration",))
            except ValueError:
                continue
            return [p, Path(val_csv)]
    return [Path(val_csv)]


def epic_action_classes(files: list[Path]) -> tuple[list[str], list[list[str]]]:
    """LaViLa's ``generate_label_map('ek100_cls')``: string-sorted ``verb:noun`` keys of ``files`` and
    each key's distinct narrations (first-seen order)."""
    narrations: dict[str, list[str]] = {}
    for path in files:
        for _, r in open_csv(path, EPIC_REQUIRED + ("narration",))[1]:
            v, n = parse_int(r["verb_class"]), parse_int(r["noun_class"])
            if v is None or n is None or v < 0 or n < 0:
                continue
            seen = narrations.setdefault(f"{v}:{n}", [])
            if r["narration"] not in seen:
                seen.append(r["narration"])
    keys = sorted(narrations)
    return keys, [narrations[k] for k in keys]


# ---------------------------------------------------------------------------------------------
# the classifier
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def text_classifier(
    encode_text: Any, classes: ClassSet, templates: tuple[str, ...], device: torch.device, batch: int = 256
) -> torch.Tensor:
    """(classes, E) float32: per class, the normalised mean of the normalised embeddings of every
    ``template.format(name)`` (LaViLa's order: templates outer, names inner)."""

    texts, owner = [], []
    for c, names in enumerate(classes.names):
        for t in templates:
            for name in names:
                texts.append(t.format(name))
                owner.append(c)
    parts = []
    for i in range(0, len(texts), batch):
        tokens = tokenize(texts[i : i + batch]).to(device)
        parts.append(F.normalize(encode_text(tokens).float(), dim=-1))
    emb = torch.cat(parts)
    owner_t = torch.tensor(owner, device=emb.device)
    sums = torch.zeros(len(classes), emb.shape[1], device=emb.device).index_add_(0, owner_t, emb)
    counts = torch.bincount(owner_t, minlength=len(classes)).clamp(min=1).unsqueeze(1)
    return F.normalize(sums / counts, dim=-1)


def view_logits(video: torch.Tensor, classifier: torch.Tensor, views: int) -> torch.Tensor:
    """(B*V, E) normalised video embeddings -> (B, K) scores: cosines for one view, else LaViLa's
    softmax of the maximum cosine over the views."""
    cos = video.float() @ classifier.T
    if views == 1:
        return cos
    return cos.view(-1, views, cos.shape[-1]).max(dim=1).values.softmax(dim=-1)


# ---------------------------------------------------------------------------------------------
# Charades-Ego mAP (LaViLa's lavila/utils/evaluation_charades.py; the accuracies: tasks.common.action_head_metrics)
# ---------------------------------------------------------------------------------------------
def charades_map(scores: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    """(mAP in percent, classes without positives) as LaViLa's ``charades_map``: rows without any
    positive get -inf scores, classes are ranked by ``np.argsort(-scores)`` (ties in numpy's order), AP =
    mean precision at the positives. A class without positives has no AP: LaViLa's ``np.mean`` returns
    NaN then; here the mean runs over the classes that have positives and their count is reported."""
    fix = np.array(scores, dtype=np.float64, copy=True)
    gt = np.asarray(targets)
    fix[gt.sum(axis=1) == 0, :] = -np.inf
    aps = []
    for c in range(fix.shape[1]):
        tp = gt[np.argsort(-fix[:, c]), c] == 1
        n_pos = tp.sum()
        if n_pos < 0.1:
            aps.append(math.nan)
            continue
        prec = np.cumsum(tp) / (np.cumsum(~tp) + np.cumsum(tp)).astype(float)
        aps.append(float(prec[tp].sum() / float(n_pos)))
    arr = np.array(aps)
    absent = int(np.isnan(arr).sum())
    return (100.0 * float(np.nanmean(arr)) if absent < arr.size else 0.0), absent

"""Narrations for the synthetic dataset: Ego4D-style pretraining pairs and EPIC-100 MIR files.

``avion-ds synth`` writes, besides its EPIC-style classification CSVs (:mod:`avion_ds.data.prep.synthetic`):

* ``ego4d_train.pkl`` as AVION / LaViLa ship it: a pickled list of ``(video_uid, start_sec, end_sec,
  narration)`` tuples (floats for the times), one per TRAIN segment, with the narration
  "#C C moves the circle up" made from the segment's verb and noun by a fixed template per verb; the same
  rows as ``ego4d_train.csv`` (``video_uid,start_sec,end_sec,narration``).
* EPIC-100 Multi-Instance Retrieval files, laid out as the annotations repository and AVION's reader
  expect them: ``retrieval_annotations/EPIC_100_retrieval_{test,train}.csv`` (the released columns; test
  = the VAL segments, train = the TRAIN segments), ``..._sentence.csv`` (``narration_id,narration``: the
  first row of each distinct narration) and ``relevancy/caption_relevancy_EPIC_100_retrieval_{test,train}.pkl``
  (a pickled float64 array, rows = CSV rows, columns = sentence rows). Relevancy as JPoSE defines it for
  EPIC-100: half the verb IoU plus half the noun IoU, i.e. 1 for the same verb and noun, 0.5 when one of
  them matches, 0 else; every row and every column holds a 1.

A narration is a function of (verb, noun) only, and both are visible in the frames (the motion and the
shape / colour), so a small dual encoder can learn them. The pickles hold only builtins and numpy arrays.
"""

from __future__ import annotations

import csv
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from avion_ds.data.prep.synthetic_labels import EPIC_COLUMNS, NOUN_NAMES, VERB_NAMES
from avion_ds.data.sampling import parse_timestamp

# per verb: the narration of a segment. The MIR files use the SAME words as the Ego4D pairs, so zero-shot
# retrieval on synth measures what pretraining learnt (a hit is an exact narration match); real EPIC
# narrations ("open drawer") differ from Ego4D's ("#C C opens the drawer"), which pretraining at scale bridges.
TEMPLATES: dict[str, str] = {
    "move-up": "#C C moves the {noun} up",
    "move-down": "#C C moves the {noun} down",
    "grow": "#C C makes the {noun} bigger",
    "shrink": "#C C makes the {noun} smaller",
    "move-left": "#C C moves the {noun} left",
    "move-right": "#C C moves the {noun} right",
    "orbit": "#C C moves the {noun} around",
    "stay": "#C C holds the {noun} still",
}
EGO4D_COLUMNS = ("video_uid", "start_sec", "end_sec", "narration")
MIR_COLUMNS = (*EPIC_COLUMNS, "all_nouns", "all_noun_classes")
MIR_DIR = "retrieval_annotations"
PICKLE_PROTOCOL = 4


def narration(verb: int, noun: int) -> str:
    """The narration of a segment (Ego4D pairs and MIR files alike): "#C C moves the circle up"."""
    return TEMPLATES[VERB_NAMES[verb]].format(noun=NOUN_NAMES[noun])


def ego4d_rows(rows: Sequence[dict]) -> list[tuple[str, float, float, str]]:
    """``(video_uid, start_sec, end_sec, narration)`` per EPIC-style row, with the row's own times."""
    return [
        (
            str(r["video_id"]),
            float(parse_timestamp(r["start_timestamp"])),
            float(parse_timestamp(r["stop_timestamp"])),
            narration(int(r["verb_class"]), int(r["noun_class"])),
        )
        for r in rows
    ]


def mir_rows(rows: Sequence[dict]) -> list[dict]:
    """EPIC-100 retrieval CSV rows: the classification columns with the EPIC narration, plus
    ``all_nouns`` / ``all_noun_classes`` (one noun each, written as the released lists are)."""
    out = []
    for r in rows:
        verb, noun = int(r["verb_class"]), int(r["noun_class"])
        out.append(
            {
                **{k: r[k] for k in EPIC_COLUMNS},
                "narration": narration(verb, noun),
                "all_nouns": str([NOUN_NAMES[noun]]),
                "all_noun_classes": str([noun]),
            }
        )
    return out


def sentence_rows(rows: Sequence[dict]) -> list[dict]:
    """The first row of each distinct narration, in CSV order: ``{"narration_id", "narration"}``."""
    seen: dict[str, dict] = {}
    for r in rows:
        seen.setdefault(r["narration"], {"narration_id": r["narration_id"], "narration": r["narration"]})
    return list(seen.values())


def relevancy(rows: Sequence[dict], sentences: Sequence[dict]) -> np.ndarray:
    """JPoSE relevancy (rows x sentences): 0.5 * verb IoU + 0.5 * noun IoU (one verb and one noun per row)."""
    by_id = {r["narration_id"]: r for r in rows}
    verbs = np.array([int(r["verb_class"]) for r in rows])
    nouns = np.array([int(r["noun_class"]) for r in rows])
    s_verbs = np.array([int(by_id[s["narration_id"]]["verb_class"]) for s in sentences])
    s_nouns = np.array([int(by_id[s["narration_id"]]["noun_class"]) for s in sentences])
    same_verb = verbs[:, None] == s_verbs[None, :]
    same_noun = nouns[:, None] == s_nouns[None, :]
    return 0.5 * same_verb.astype(np.float64) + 0.5 * same_noun.astype(np.float64)


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)
    return path


def _write_pickle(path: Path, obj: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=PICKLE_PROTOCOL)
    return path


def write_mir(out: str | Path, split: str, rows: Sequence[dict]) -> dict[str, Path]:
    """``EPIC_100_retrieval_{split}.csv``, its ``_sentence.csv`` and relevancy pickle under ``out/retrieval_annotations``."""
    base = Path(out) / MIR_DIR
    mir = mir_rows(rows)
    sentences = sentence_rows(mir)
    name = f"EPIC_100_retrieval_{split}"
    return {
        f"mir_{split}_csv": _write_csv(base / f"{name}.csv", MIR_COLUMNS, mir),
        f"mir_{split}_sentences": _write_csv(base / f"{name}_sentence.csv", ("narration_id", "narration"), sentences),
        f"mir_{split}_relevancy": _write_pickle(
            base / "relevancy" / f"caption_relevancy_{name}.pkl", relevancy(mir, sentences)
        ),
    }


def write_text_annotations(out: str | Path, train_rows: Sequence[dict], val_rows: Sequence[dict]) -> dict:
    """All narration files for one synthetic dataset (see the module doc); returns their paths by key and
    ``num_narrations`` (distinct narrations over both splits). A split without rows gets no MIR files."""
    out = Path(out)
    pairs = ego4d_rows(train_rows)
    info: dict = {
        "ego4d_train_pkl": _write_pickle(out / "ego4d_train.pkl", pairs),
        "ego4d_train_csv": _write_csv(
            out / "ego4d_train.csv", EGO4D_COLUMNS, [dict(zip(EGO4D_COLUMNS, p, strict=True)) for p in pairs]
        ),
    }
    for split, rows in (("test", val_rows), ("train", train_rows)):
        if rows:
            info.update(write_mir(out, split, rows))
    info["num_narrations"] = len({(int(r["verb_class"]), int(r["noun_class"])) for r in [*train_rows, *val_rows]})
    return info

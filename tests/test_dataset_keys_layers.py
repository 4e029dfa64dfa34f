"""Datasets own their keys: no string in avion_ds/config or avion_ds/engine names a registered dataset, a
dataset's own recipe key (``epic_mir.val_sentences``) or one of its old spellings (``data.val_sentences``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from avion_ds.config import DataConfig, registered_sections, renamed_keys
from avion_ds.data.datasets.build import dataset_names
from avion_ds.data.datasets.registry import lookup

ROOT = Path(__file__).resolve().parents[1]
# the one dataset name config/ holds: the default of data.dataset (what a recipe without one trains on)
ALLOWED = {("sections.py", DataConfig.__dataclass_fields__["dataset"].default)}


def _dataset_words() -> set[str]:
    """Registered dataset names, their sections' dotted keys and those keys' old spellings."""
    names = set(dataset_names())
    words = set(names)
    for name in names:
        section = lookup(name).section
        if section is not None:
            own = {f.name for f in dataclasses.fields(section)}
            words |= {f"{name}.{field}" for field in own}
    words |= {old for old, new in renamed_keys().items() if new.split(".")[0] in names}
    return words


def _found(words: set[str], folder: str) -> list[str]:
    found = []
    for path in sorted((ROOT / "avion_ds" / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            hit = text in words or ("." in text and text.split(".")[0] in set(dataset_names()))
            if hit and (path.name, text) not in ALLOWED:
                found.append(f"{folder}/{path.name}:{node.lineno} {text!r}")
    return found


def test_dataset_sections_are_registered() -> None:
    """The built-ins with keys of their own register them as recipe sections named like the dataset."""
    assert {"epic", "epic_mir", "ego4d", "videos"} <= set(registered_sections())
    assert renamed_keys()["data.val_sentences"] == "epic_mir.val_sentences"


def test_config_and_engine_name_no_dataset_or_dataset_key() -> None:
    words = _dataset_words()
    assert "epic_mir.val_sentences" in words and "ego4d.aux_train" in words and "data.epic_label" in words
    assert not _found(words, "config") + _found(words, "engine")

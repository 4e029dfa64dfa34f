"""EPIC-Kitchens-100 actions numbered as AVION numbers them (``epic.label: action``).

AVION's ``avion/utils/misc.py`` ``generate_label_map('ek100_cls')`` reads the train and the validation CSV,
collects every ``"{verb_class}:{noun_class}"`` string and sorts the strings: action ``i`` is the ``i``-th of
them (3806 on EPIC-100). The order is the STRING order ("10:2" before "1:3"), which AVION's released CLS
checkpoints (``module.fc_cls``) are trained on, so a head loaded from them needs exactly this map. Rows
whose classes do not parse as non-negative integers are left out (AVION's ``int()`` would stop on them;
here the dataset reports them as bad samples).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# how the eval JSON names the map (its order and source)
MAP_ORDER = "AVION generate_label_map: string-sorted 'verb:noun' over data.train_csv + data.val_csv"


@dataclass
class ActionMap:
    """Actions in id order: ``keys[i]`` is ``"verb:noun"``, ``verbs[i]`` / ``nouns[i]`` its classes."""

    keys: tuple[str, ...]
    verbs: tuple[int, ...]
    nouns: tuple[int, ...]
    ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.ids = {k: i for i, k in enumerate(self.keys)}

    def __len__(self) -> int:
        return len(self.keys)

    def id_of(self, verb: int, noun: int) -> int | None:
        """The action id of (verb, noun), None when the pair is not in the map."""
        return self.ids.get(f"{verb}:{noun}")


def action_map_from_pairs(pairs: Iterable[tuple[int | None, int | None]]) -> ActionMap:
    """The map of (verb, noun) ``pairs`` (repeats allowed; a pair with a class that is None or negative, i.e.
    did not parse, is left out): AVION's string sort of ``"verb:noun"``. The CSVs are read by
    :func:`avion_ds.data.datasets.epic.epic_action_map`."""
    keys = tuple(sorted({f"{v}:{n}" for v, n in pairs if v is not None and n is not None and v >= 0 and n >= 0}))
    split = [k.split(":") for k in keys]
    return ActionMap(keys, tuple(int(v) for v, _ in split), tuple(int(n) for _, n in split))


def map_files(train_csv: str, val_csv: str) -> list[str]:
    """The two CSVs the map is built from; ValueError naming the key that is unset (the map needs both:
    another set of files numbers the actions differently)."""
    for key, value in (("data.train_csv", train_csv), ("data.val_csv", val_csv)):
        if not value:
            raise ValueError(
                f"{key} is empty: epic.label=action numbers actions over data.train_csv + data.val_csv "
                "(AVION's generate_label_map), so both files are needed"
            )
    return [train_csv, val_csv]

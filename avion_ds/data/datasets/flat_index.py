"""Narration rows (Ego4D and its rephraser / narrator files) as flat arrays, cached beside the first file.

Four million rows held as Python tuples and strings cost ~1 GiB per process and are copied into
every forked DataLoader worker as it reads them. Here the rows of ``data.train_csv`` and every
``ego4d.aux_train`` file (or ``data.val_csv``) are one :mod:`avion_ds.data.index_cache` index:
numeric columns, video uids interned, and every narration string in one buffer. Each row's
narration keeps what was read: a string (kind 0), a list / tuple of non-empty strings (kind 1),
or anything else (kind 2: its short ``repr`` is kept for the error it raises when drawn), so the
same rows, values, draws and error messages come out as from the Python objects.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.data.index_cache import Arrays, MappedIndex, StringPacker, Strings, cached_index, pack_strings

LAYOUT = 2  # version of the arrays below: a cache of another layout is rebuilt
Records = Iterable[tuple[int, Any, Any, Any, Any]]  # (row N of its file, video_uid, start, end, narration)


def finite_or_nan(value: Any) -> float:
    """float(value), nan when it is not a finite number."""
    if isinstance(value, bool):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Unreadable:
    """A narration that is neither a string nor a list of non-empty strings: only its repr is kept."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _narration_parts(value: Any) -> tuple[int, list[str]]:
    """(kind, strings) of one narration value (module doc)."""
    if isinstance(value, str):
        return 0, [value]
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple) and value and all(isinstance(x, str) and x.strip() for x in value):
        return 1, list(value)
    return 2, [short_repr(value)]


def build_narration_arrays(
    paths: list[Path], read_records: Callable[[Path], Records], spill: bool = False
) -> tuple[Arrays, dict]:
    """The index arrays of the rows of ``paths`` one after another (AVION's ConcatDataset), uids merged.

    ``read_records`` may yield its rows one at a time: each goes straight into compact columns and one
    string buffer, so no row is held as a Python object here (4M Ego4D rows: ~0.33 GiB of columns, of which
    the text ~0.17 GiB goes to a temporary file with ``spill``: the cached build writes it from there)."""
    lookup: dict[str, int] = {}
    src, line, vid, kind = array("h"), array("q"), array("i"), array("b")
    start, end, bad_rows = array("d"), array("d"), array("q")
    row_str: array | None = None  # each row's first string, from the first row that is not one plain string
    strings, bad_text = StringPacker(spill), StringPacker()
    add_text, add_kind = strings.add, kind.append
    add_line, add_vid, add_start, add_end = line.append, vid.append, start.append, end.append
    for f, path in enumerate(paths):
        first = len(line)
        for row, uid, s, e, narration in read_records(path):
            a, b = finite_or_nan(s), finite_or_nan(e)
            if math.isnan(a) or math.isnan(b):
                bad_rows.append(len(line))
                bad_text.add(short_repr(s))
                bad_text.add(short_repr(e))
            add_line(row)
            add_vid(lookup.setdefault(str(uid), len(lookup)))
            add_start(a)
            add_end(b)
            if type(narration) is str:
                add_text(narration)
                add_kind(0)
                if row_str is not None:
                    row_str.append(len(strings))
                continue
            if row_str is None:  # every row so far one string: row j starts at string j
                row_str = array("q", range(len(line)))
            k, parts = _narration_parts(narration)
            for part in parts:
                add_text(part)
            add_kind(k)
            row_str.append(len(strings))
        if len(line) == first:
            raise ValueError(f"{path}: no narration rows")
        src.extend(array("h", [f]) * (len(line) - first))
    arrays = {
        "src": np.frombuffer(src, np.int16),
        "line": np.frombuffer(line, np.int64),
        "vid": np.frombuffer(vid, np.int32),
        "start": np.frombuffer(start, np.float64),
        "end": np.frombuffer(end, np.float64),
        "kind": np.frombuffer(kind, np.int8),
        "row_str": np.frombuffer(row_str, np.int64) if row_str is not None else np.empty(0, np.int64),
        "bad_rows": np.frombuffer(bad_rows, np.int64),
    }
    arrays["text_buf"], arrays["text_off"] = strings.arrays()
    arrays["uid_buf"], arrays["uid_off"] = pack_strings(lookup)
    arrays["bad_buf"], arrays["bad_off"] = bad_text.arrays()
    # every row a plain string: row k is string k (``row_str`` is then empty, and not read)
    return arrays, {"one_string_each": not arrays["kind"].any()}


class NarrationTexts(Sequence[Any]):
    """Row ``k``'s narration as read: a string, a tuple of strings, or an :class:`Unreadable`."""

    def __init__(self, kind: np.ndarray, row_str: np.ndarray, strings: Strings, one_string_each: bool) -> None:
        self.kind, self.row_str, self.strings, self.one_string_each = kind, row_str, strings, one_string_each
        self._kind, self._row_str = memoryview(kind), memoryview(row_str)

    def __len__(self) -> int:
        return len(self.kind)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        if self.one_string_each:
            return self.strings[k]
        kind, a = self._kind[k], self._row_str[k]
        if kind == 0:
            return self.strings[a]
        if kind == 1:
            return tuple(self.strings[j] for j in range(a, self._row_str[k + 1]))
        return Unreadable(self.strings[a])


class BadTimes(Mapping[int, tuple[str, str]]):
    """``{row: (start, end) as read}`` of the rows whose times are not numbers (nan in the columns).

    The values are the reprs (cut to 80 characters) of what the file held, as error messages show them."""

    def __init__(self, rows: np.ndarray, text: Strings, start: np.ndarray, end: np.ndarray) -> None:
        self.rows, self.text, self.start, self.end = rows, text, start, end

    def __contains__(self, k: object) -> bool:
        if not len(self.rows) or not isinstance(k, (int, np.integer)) or not 0 <= k < len(self.start):
            return False
        return _nan(self.start[k], self.end[k])

    def __getitem__(self, k: int) -> tuple[str, str]:
        j = int(np.searchsorted(self.rows, k))
        if j >= len(self.rows) or self.rows[j] != k:
            raise KeyError(k)
        return _Raw(self.text[2 * j]), _Raw(self.text[2 * j + 1])

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows.tolist())

    def __len__(self) -> int:
        return len(self.rows)


def _nan(a: float, b: float) -> bool:
    return a != a or b != b  # noqa: PLR0124 - nan test on numpy scalars without a call


class _Raw(str):
    """A repr kept as text: its own repr is the text (so ``short_repr`` shows what the file held)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def load_narration_index(paths: list[Path], read_records: Callable[[Path], Records]) -> MappedIndex:
    """The cached index of the narration files ``paths`` (built with ``read_records`` when needed)."""
    return cached_index("narrations", LAYOUT, paths, lambda: build_narration_arrays(paths, read_records, spill=True))


def narration_columns(index: MappedIndex, files: list[Path]) -> dict[str, Any]:
    """The columns of a narration index: ``files src line uids vid start end text bad_times``."""
    a = index.arrays
    return {
        "files": list(files),
        "src": a["src"],
        "line": a["line"],
        "uids": Strings(a["uid_buf"], a["uid_off"]).tolist(),
        "vid": a["vid"],
        "start": a["start"],
        "end": a["end"],
        "text": NarrationTexts(
            a["kind"], a["row_str"], Strings(a["text_buf"], a["text_off"]), bool(index.meta["one_string_each"])
        ),
        "bad_times": BadTimes(a["bad_rows"], Strings(a["bad_buf"], a["bad_off"]), a["start"], a["end"])
        if len(a["bad_rows"])
        else {},
    }

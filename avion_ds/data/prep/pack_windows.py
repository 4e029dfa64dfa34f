"""Which chunks of a video one shard item holds: windows of consecutive chunks of bounded size.

A sample reads its item whole (litdata reads an item at a time), so an item holding a whole long video
(an Ego4D video is ~23 min: hundreds of MB) would make every clip read the whole video. Items are windows
of consecutive chunks up to ``limit`` bytes instead; consecutive windows share one chunk, so a clip that
crosses a chunk boundary finds both chunks in one item. Each row goes to the window holding every chunk its
frames ``[start, end)`` touch (the samplers never read outside a row's span); a window grows past ``limit``
only when a row needs it (a row longer than a window, e.g. a whole video for masked pretraining).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Window = tuple[int, int, dict[str, list[Any]]]  # first chunk, last chunk (inclusive), split -> its rows


def row_chunks(starts: Sequence[int], row: Sequence[Any]) -> tuple[int, int]:
    """(first, last) index of the chunks (their ``starts``, ascending) that frames ``[row[0], row[1])`` touch."""
    first = max(0, bisect_right(starts, int(row[0])) - 1)
    last = max(first, bisect_right(starts, max(int(row[0]), int(row[1]) - 1)) - 1)
    return first, last


def chunk_windows(
    starts: Sequence[int], sizes: Sequence[int], rows: Mapping[str, Sequence[Sequence[Any]]], limit: int
) -> list[Window]:
    """Windows of a video's chunks (``starts`` / ``sizes`` in start-frame order) and the rows each serves.

    A window is at most ``limit`` bytes and at least two chunks (one when the video has one), unless its
    rows need more; the next window starts at its last chunk. A row whose first chunk is a window's last
    goes to the next window (the last window takes them). Every row is in exactly one window, in its
    split's order."""
    n = len(starts)
    if n == 0:
        return []
    spans = {split: _row_chunk_spans(starts, rs) for split, rs in rows.items()}  # (k, 2): first, last chunk

    def served(sp: np.ndarray, s: int, e: int) -> np.ndarray:
        a = sp[:, 0]
        return (a >= s) & ((a < e) | ((e == n - 1) & (a == e)))

    out: list[Window] = []
    s = 0
    while True:
        e, size = s, int(sizes[s])
        while e + 1 < n and size + int(sizes[e + 1]) <= limit:
            e, size = e + 1, size + int(sizes[e + 1])
        e = max(e, min(s + 1, n - 1))
        while True:  # grow until every row starting before the last chunk fits
            need = max((int(sp[served(sp, s, e), 1].max(initial=e)) for sp in spans.values()), default=e)
            if need <= e:
                break
            e = need
        mine = {split: [rs[int(k)] for k in np.flatnonzero(served(spans[split], s, e))] for split, rs in rows.items()}
        out.append((s, e, mine))
        if e == n - 1:
            return out
        s = e


def _row_chunk_spans(starts: Sequence[int], rows: Sequence[Sequence[Any]]) -> np.ndarray:
    """:func:`row_chunks` of every row at once -> (k, 2) int64."""
    at = np.asarray(starts, np.int64)
    first_frame = np.fromiter((int(r[0]) for r in rows), np.int64, len(rows))
    last_frame = np.maximum(first_frame, np.fromiter((int(r[1]) for r in rows), np.int64, len(rows)) - 1)
    first = np.maximum(np.searchsorted(at, first_frame, side="right") - 1, 0)
    last = np.maximum(first, np.searchsorted(at, last_frame, side="right") - 1)
    return np.stack([first, last], axis=1)

"""Bad input samples seen by the training / evaluation loops: each file named once per run, fatal ones
stop every rank together.

Datasets with ``defer_errors`` put the messages of skipped samples (``bad``) and an ``on_error: raise``
error (``fatal``) into the batch instead of logging or raising inside a DataLoader worker. The loop
exchanges them across ranks only when the existing per-step reduction says some rank has any, so the
normal path costs nothing extra. Rank 0 names each file once; every rank raises the same
:class:`DataError` (one line, exit 2) instead of one rank dying and the others reporting a broken
connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from avion_ds.data.errors import DataError
from avion_ds.distributed import dist


def source_of(message: str) -> str:
    """The file (or CSV row) a bad-sample message names: the text before its first ': '."""
    return message.split(": ", 1)[0]


def batch_messages(batch: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(skipped-sample messages, fatal messages) a collated batch carries (empty without deferral)."""
    bad = [m for text in batch.get("bad", ()) for m in str(text).split("\n") if m]
    fatal = [str(m) for m in batch.get("fatal", ()) if m]
    return bad, fatal


class BadInputLog:
    """Names each bad file once per run on rank 0 and counts repeats; raises deferred fatal errors."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.named: set[str] = set()
        self.repeats = 0

    def report(self, bad: list[str]) -> None:
        """Name the files not named yet (rank 0); count the rest."""
        for msg in bad:
            key = source_of(msg)
            if key in self.named:
                self.repeats += 1
                continue
            self.named.add(key)
            if dist.is_main():
                self.emit(f"bad input, skipped: {msg} (named once; later samples of it are only counted)")

    def exchange(self, bad: list[str], fatal: list[str]) -> None:
        """Collective: gather every rank's messages, name new files, raise the first fatal on all ranks."""
        gathered = dist.all_gather_object((bad, fatal))
        self.report([m for b, _ in gathered for m in b])
        fatals = [m for _, f in gathered for m in f]
        if fatals:
            raise DataError(fatals[0])

"""A ``--plugin`` for training runs in tests: every training clip a rank reads from shards (DataLoader workers
included) appends its sample index to ``$AVION_TEST_SAMPLES/rank<RANK>.txt``, so a test can tell which samples
each rank trained on. With ``$AVION_TEST_HOLD_AT=N`` a process sleeps before its (N+1)-th training read (0
DataLoader workers: after the checkpoint of the steps before it), so a test kills it at a known point."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from avion_ds.data.shards import ShardClipDataset

_read = ShardClipDataset.__getitem__
_HOLD = os.environ.get("AVION_TEST_HOLD_AT")
_READS = [0]  # training reads in this process


def _recorded(self: ShardClipDataset, index: Any) -> Any:
    if _HOLD is not None and self.clips.split == "train" and _READS[0] == int(_HOLD):
        time.sleep(600)  # the test kills the process here
    item = _read(self, index)
    if self.clips.split == "train":
        _READS[0] += 1
    if self.clips.split == "train" and isinstance(item, dict) and "index" in item:
        out = Path(os.environ["AVION_TEST_SAMPLES"]) / f"rank{os.environ.get('RANK', '0')}.txt"
        with open(out, "a") as f:  # one short line per write: lines of concurrent workers stay whole
            f.write(f"{int(item['index'])}\n")
    return item


ShardClipDataset.__getitem__ = _recorded

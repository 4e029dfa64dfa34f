"""A ``--plugin`` for training runs in tests: every training clip a rank reads from shards (DataLoader workers
included) appends its sample index to ``$AVION_TEST_SAMPLES/rank<RANK>.txt``, so a test can tell which samples
each rank trained on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from avion_ds.data.shards import ShardClipDataset

_read = ShardClipDataset.__getitem__


def _recorded(self: ShardClipDataset, index: Any) -> Any:
    item = _read(self, index)
    if self.clips.split == "train" and isinstance(item, dict) and "index" in item:
        out = Path(os.environ["AVION_TEST_SAMPLES"]) / f"rank{os.environ.get('RANK', '0')}.txt"
        with open(out, "a") as f:  # one short line per write: lines of concurrent workers stay whole
            f.write(f"{int(item['index'])}\n")
    return item


ShardClipDataset.__getitem__ = _recorded

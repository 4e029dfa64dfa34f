"""One check the shard tests share: a packed location gives the chunk tree's clips and labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def assert_shards_give_tree_clips(location: str | Path, recipe: Any, seed: int = 3) -> dict[str, int]:
    """Every row of train (epoch 1) and val (epoch 0) read from the shards at ``location`` equals the chunk
    tree's sample of the same index (frames and label), every row once; returns split -> rows."""
    from avion_ds.data.datasets.build import build_dataset, open_shards

    sizes = {}
    for split, epoch in (("train", 1), ("val", 0)):
        ref = build_dataset(recipe.data, split, seed=seed, sections=recipe.sections)
        ds = open_shards(str(location), recipe.data, split, seed=seed, sections=recipe.sections)
        ref.set_epoch(epoch)
        ds.set_clip_epoch(epoch)
        got = {item["index"]: item for item in ds}
        assert sorted(got) == list(range(len(ref))), split
        for i, item in got.items():
            want = ref[i]
            assert torch.equal(item["frames"], want["frames"]), (split, i)
            label, expected = item["label"], want["label"]
            same = torch.equal(label, expected) if isinstance(expected, torch.Tensor) else label == expected
            assert same and item.get("past_end") == want.get("past_end"), (split, i, label, expected)
        sizes[split] = len(ref)
    return sizes

"""One rank of a shard read under torchrun: the dataset is built BEFORE the process group (as training's
start-up builds it), the loader after; the rank writes the sample ids it read in epoch 0 to OUT/rank<N>.json.

    torchrun --nproc_per_node 2 tests/helpers/shard_ranks.py RECIPE SHARDS OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import torch.distributed as dist

    from avion_ds.data.datasets.build import open_shards
    from avion_ds.data.loader import build_loader, set_epoch
    from avion_ds.tasks import load_recipe

    recipe_path, shards, out = sys.argv[1:4]
    recipe = load_recipe(recipe_path, [])
    ds = open_shards(shards, recipe.data, "train", seed=3, sections=recipe.sections)
    dist.init_process_group("gloo")
    loader = build_loader(ds, 2, 0, shuffle=True, seed=3, drop_last=True, distributed=True)
    set_epoch(loader, 0)
    ids = [i for batch in loader for i in batch["index"].tolist()]
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(ids))
    dist.destroy_process_group()

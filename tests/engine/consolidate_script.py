"""Tiny real DeepSpeed checkpoints for tests/engine/test_consolidate.py.

``save_run`` trains vit_test_tiny (two param groups; two params frozen, one of them with an odd element
count so ZeRO-3 pads it) for 2 AdamW steps under one ZeRO stage and saves it with ``engine.checkpoint.save`` (shards,
client files, COMPLETE.json, ds_config.json). Run under torchrun (2 CPU ranks), ``main`` saves the
ZeRO 1, 2, 3 (fp32) and ZeRO-2 (bf16) runs of that world size in ONE launch: ROOT/z1_fp32, ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from avion_ds.engine import checkpoint as ckpt
from avion_ds.models import create_model
from avion_ds.models.partition import partitioned_construction

FROZEN = ("patch_embed.proj.bias", "heads.noun.bias")  # noun bias: 3 values, odd -> ZeRO-3 padding on 2 ranks
HEADS = {"verb": 4, "noun": 3}
WS2_RUNS = ((1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "bf16"))


def save_run(run: Path, stage: int, precision: str = "fp32") -> None:
    """Train 2 steps under ZeRO ``stage`` on the current process group and save a checkpoint into ``run``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = {
        "train_batch_size": 2 * world,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": precision == "bf16"},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05, "torch_adam": True}},
    }
    torch.manual_seed(0)
    with partitioned_construction(cfg):
        model = create_model("vit_test_tiny", heads=HEADS)
    for name, p in model.named_parameters():
        p.requires_grad_(name not in FROZEN)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() > 1]},  # two groups, as the trainer's decay / no-decay
        {"params": [p for p in trainable if p.dim() <= 1], "weight_decay": 0.0},
    ]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(1 + rank)
    for _ in range(2):
        out = engine(torch.randn(2, 3, 4, 32, 32).to(dtype))
        engine.backward(sum(v.float().square().mean() for v in out.values()))
        engine.step()
    if rank == 0:
        run.mkdir(parents=True, exist_ok=True)
        (run / "ds_config.json").write_text(json.dumps(cfg))
    ckpt.save(engine, run, 2, {"epoch": 0, "step_in_epoch": 2, "global_step": 2}, keep_last=1)
    engine.destroy()


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    root = Path(sys.argv[1])
    for stage, precision in WS2_RUNS:
        save_run(root / f"z{stage}_{precision}", stage, precision)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()

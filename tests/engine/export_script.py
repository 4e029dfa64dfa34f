"""Run by test_export_stream.py on 2 CPU ranks: a partitioned ZeRO-3 vit_test_tiny trains 2 AdamW
steps and saves a checkpoint into RUN_DIR; rank 0 writes the LIVE (gathered) weights to live.pt."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from avion_ds.engine import run_checkpoints as ckpt
from avion_ds.models import create_model
from avion_ds.models.partition import gathered, partitioned_construction


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    run = Path(sys.argv[1])
    cfg = {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05, "torch_adam": True}},
    }
    torch.manual_seed(0)
    with partitioned_construction(cfg):
        model = create_model("vit_test_tiny", heads={"verb": 4, "noun": 3}, layer_scale=0.1)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    torch.manual_seed(1 + dist.get_rank())
    for _ in range(2):
        out = engine(torch.randn(2, 3, 4, 32, 32))
        engine.backward(sum(v.square().mean() for v in out.values()))
        engine.step()
    if dist.get_rank() == 0:
        run.mkdir(parents=True, exist_ok=True)
        (run / "ds_config.json").write_text(json.dumps(cfg))
    ckpt.save(engine, run, 2, {"epoch": 0, "step_in_epoch": 2, "global_step": 2}, keep_last=1)
    live = {}
    for n, p in engine.module.named_parameters():
        with gathered([p], modifier_rank=None):
            live[n] = p.data.detach().clone().float()
    if dist.get_rank() == 0:
        torch.save(live, run / "live.pt")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()

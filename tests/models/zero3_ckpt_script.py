"""Run by test_checkpointing_zero3.py in a subprocess: one-rank ZeRO-3 training steps without and
with activation checkpointing (torch and deepspeed impls, the selective policy), and the selective
policy under ZeRO 0-2; prints the loss trajectories as JSON."""

from __future__ import annotations

import json
import os

import torch

os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

import deepspeed
from ds_steps import checkpointed_losses  # next to this script (run as a subprocess)

from avion_ds.models import apply_activation_checkpointing, create_model


def losses(impl: str | None, stage: int = 3) -> list[float]:
    torch.manual_seed(0)
    model = create_model(
        "vit_test_tiny",
        layer_scale=0.1,
        pool="cls",
        pos_embed="learned",
        head_init_scale=1.0,
        drop_path_rate=0.2,
        heads={"verb": 3, "noun": 2},
    )
    if impl == "selective":
        apply_activation_checkpointing(model, policy="selective")
    elif impl:
        apply_activation_checkpointing(model, impl=impl)
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "zero_allow_untested_optimizer": True,
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return checkpointed_losses(engine, cfg, impl)


if __name__ == "__main__":
    deepspeed.init_distributed(dist_backend="gloo")
    result = {str(impl): losses(impl) for impl in (None, "torch", "deepspeed", "selective")}
    result |= {f"selective@{stage}": losses("selective", stage) for stage in (0, 1, 2)}
    print("RESULT " + json.dumps(result), flush=True)
    torch.distributed.destroy_process_group()
    os._exit(0)

"""Tiny real DeepSpeed checkpoints for tests/engine/test_consolidate.py.

``save_run`` trains vit_test_tiny (two param groups; two params frozen, one of them with an odd element
count so ZeRO-3 pads it) or the tiny dual encoder (``model="clip"``: its ``logit_scale`` frozen, as MIR
fine-tuning) for 2 AdamW steps under one ZeRO stage and saves it with ``engine.run_checkpoints.save`` (shards,
client files, COMPLETE.json, ds_config.json), and the live model's full state dict as ``live.pt``. Run
under torchrun (2 CPU ranks), ``main`` saves the ZeRO 0, 1, 2, 3 (fp32), ZeRO-2 (bf16) and dual-encoder
ZeRO 0-3 runs of that world size in ONE launch: ROOT/z1_fp32, ..., ROOT/clip_z0, ...
"""

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
from avion_ds.models.partition import partitioned_construction

FROZEN = ("patch_embed.proj.bias", "heads.noun.bias")  # noun bias: 3 values, odd -> ZeRO-3 padding on 2 ranks
HEADS = {"verb": 4, "noun": 3}
WS2_RUNS = ((0, "fp32"), (1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "bf16"))
CLIP_STAGES = (0, 1, 2, 3)
LIVE = "live.pt"


def _model(model: str) -> torch.nn.Module:
    if model == "clip":
        return create_model("clip_vit_test_tiny", freeze_logit_scale=True, text_vocab_size=64, text_context_length=8)
    return create_model("vit_test_tiny", heads=HEADS)


def _loss(engine: deepspeed.DeepSpeedEngine, model: str, dtype: torch.dtype) -> torch.Tensor:
    if model == "clip":
        out = engine(torch.randn(2, 3, 2, 32, 32).to(dtype), torch.randint(0, 64, (2, 8)))
        return (out.video @ out.text.T).square().mean()
    return sum(v.float().square().mean() for v in engine(torch.randn(2, 3, 4, 32, 32).to(dtype)).values())


def live_state(engine: deepspeed.DeepSpeedEngine) -> dict[str, torch.Tensor]:
    """The module's full state dict (ZeRO-3 partitions gathered), as the live model holds it."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=hasattr(params[0], "ds_id")):
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def save_run(run: Path, stage: int, precision: str = "fp32", model: str = "vit") -> None:
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
        net = _model(model)
    for name, p in net.named_parameters():
        p.requires_grad_(p.requires_grad and name not in FROZEN)
    trainable = [p for p in net.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() > 1]},  # two groups, as the trainer's decay / no-decay
        {"params": [p for p in trainable if p.dim() <= 1], "weight_decay": 0.0},
    ]
    engine, *_ = deepspeed.initialize(model=net, model_parameters=groups, config=cfg)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(1 + rank)
    for _ in range(2):
        engine.backward(_loss(engine, model, dtype))
        engine.step()
    live = live_state(engine)
    if rank == 0:
        run.mkdir(parents=True, exist_ok=True)
        (run / "ds_config.json").write_text(json.dumps(cfg))
        torch.save(live, run / LIVE)
    ckpt.save(engine, run, 2, {"epoch": 0, "step_in_epoch": 2, "global_step": 2}, keep_last=1)
    engine.destroy()


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    root = Path(sys.argv[1])
    for stage, precision in WS2_RUNS:
        save_run(root / f"z{stage}_{precision}", stage, precision)
    for stage in CLIP_STAGES:
        save_run(root / f"clip_z{stage}", stage, model="clip")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()

"""The 3-step training loop shared by zero_init_script.py and zero3_ckpt_script.py (run as scripts:
imported from this directory)."""

from __future__ import annotations

from typing import Any

import deepspeed
import torch


def train_steps(engine: Any, cfg: dict, impl: str | None, steps: int = 3) -> list[float]:
    """``steps`` DeepSpeed steps on random 2x3x4x32x32 clips (seed 1), sum of squared logits per
    head as the loss; ``impl == "deepspeed"`` configures deepspeed.checkpointing first."""
    if impl == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=cfg)
    torch.manual_seed(1)
    out = []
    for _ in range(steps):
        logits = engine(torch.randn(2, 3, 4, 32, 32))
        loss = sum(v.square().mean() for v in logits.values())
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out

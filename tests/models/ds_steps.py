"""Shared by the ZeRO-3 test scripts (run as subprocesses): three seeded training steps of an engine
whose model may be activation-checkpointed, returning the losses."""

from __future__ import annotations

from typing import Any

import deepspeed
import torch


def checkpointed_losses(engine: Any, cfg: dict[str, Any], impl: str | None, steps: int = 3) -> list[float]:
    """Losses of ``steps`` steps on seeded random clips (multi-head logits: sum of mean squares)."""
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

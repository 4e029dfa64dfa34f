"""A non-finite micro-batch skips its WHOLE gradient-accumulation window, on every rank.

Skipping only the bad micro-batch (no backward, no ``engine.step``) would shift every later window
by one micro-batch and keep the window's earlier gradients, to be applied with the next window or
carried past a checkpoint. Instead the bad micro-batch's backward runs on a NaN loss (decided on the
device, no host sync: :func:`poison_nonfinite`), so the window's gradients are non-finite (on every
rank once DeepSpeed reduces them); the window's remaining micro-batches run as usual, keeping
DeepSpeed's micro-step count aligned; at the boundary one all-reduce of the window's per-micro-batch
non-finite flags gives every rank the same verdict (engine/trainer.py), and the update is discarded:

* optimizers DeepSpeed wraps (fp16, bf16, ZeRO 1-3) detect the non-finite gradients, clear their
  gradient buffers and skip the step (and the lr scheduler step), exactly as for an fp16 overflow;
* the plain torch optimizer of fp32 ZeRO-0 does not check, so the boundary is finished here:
  gradients dropped, the engine's step counters advanced, nothing applied.

Either way ``global_step`` (the data position that resume depends on) advances by one window.
"""

from __future__ import annotations

from typing import Any

import torch


def poison(loss: torch.Tensor) -> torch.Tensor:
    """A loss whose gradients are NaN everywhere (the window it belongs to must not be applied)."""
    return loss * float("nan")


def poison_nonfinite(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` itself when finite, else :func:`poison` of it, decided on the device (no host sync).

    ``loss * 1`` back-propagates bit-identical gradients; a non-finite loss gives NaN gradients
    everywhere, so the window's gradients are non-finite and the boundary discards it.
    """
    factor = loss.detach() * 0.0 + 1.0  # 1 for a finite loss, NaN for inf / NaN (two cheap ops)
    return loss * factor


def _finish_without_update(engine: Any) -> None:
    """Boundary of a discarded window for an optimizer DeepSpeed does not wrap (fp32 ZeRO-0)."""
    engine.zero_grad()
    engine.optimizer.zero_grad(set_to_none=True)
    engine.micro_steps += 1  # what engine.step() does at a boundary, minus the update and the lr step
    engine.global_steps += 1
    engine.global_samples += engine.train_batch_size()
    engine.skipped_steps += 1


def step_window(engine: Any, poisoned: bool) -> bool:
    """``engine.step()`` for one micro-batch; True when it applied an optimizer update.

    ``poisoned``: this micro-batch's window holds a non-finite micro-batch; at its boundary no
    update may happen (checked: DeepSpeed applying one raises instead of corrupting the weights).
    """
    boundary = engine.is_gradient_accumulation_boundary()
    if poisoned and boundary and not hasattr(engine.optimizer, "overflow"):
        _finish_without_update(engine)
        return False
    engine.step()
    if not boundary:
        return False
    applied = bool(engine.was_step_applied())
    if poisoned and applied:
        raise RuntimeError(
            "DeepSpeed applied an optimizer step with non-finite gradients "
            f"({type(engine.optimizer).__name__}); refusing to continue with corrupted weights"
        )
    return applied

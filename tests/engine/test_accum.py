"""Window skipping and fp16 bookkeeping against stand-in engines (no DeepSpeed needed): what happens at a
boundary for each kind of optimizer, and the ZeRO-0 fp16 grad norm without the loss scale."""

from __future__ import annotations

import pytest
import torch

from avion_ds.engine.accum import poison, step_window
from tests.helpers.models import zero0_grad_norm


class _Engine:
    """Just enough of a DeepSpeedEngine: micro-step boundary, step(), was_step_applied()."""

    def __init__(self, optimizer: object, accum: int = 2, applies: bool = True) -> None:
        self.optimizer, self.accum, self.applies = optimizer, accum, applies
        self.micro_steps = self.global_steps = self.global_samples = self.skipped_steps = 0
        self.steps_taken, self._applied = 0, False
        self.module = torch.nn.Linear(3, 2)

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.accum == 0

    def step(self) -> None:
        self._applied = False
        if self.is_gradient_accumulation_boundary():
            self.steps_taken += 1
            self._applied = self.applies
            self.global_steps += 1
        self.micro_steps += 1

    def was_step_applied(self) -> bool:
        return self._applied

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None

    def train_batch_size(self) -> int:
        return 8


class _Wrapped:
    """A DeepSpeed optimizer wrapper (FP16_Optimizer, BF16_Optimizer, ZeRO): has ``overflow``."""

    overflow = False


def test_plain_optimizer_boundary_of_a_poisoned_window_applies_nothing() -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    eng = _Engine(opt)
    eng.module = model
    assert step_window(eng, poisoned=True) is False and eng.micro_steps == 1  # first half: plain step()
    model(torch.randn(4, 3)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    assert step_window(eng, poisoned=True) is False  # boundary: finished here, no optimizer step
    assert eng.steps_taken == 0 and eng.micro_steps == 2 and eng.global_steps == 1 and eng.skipped_steps == 1
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not opt.state  # Adam moments never saw the window
    assert step_window(eng, poisoned=False) is False and step_window(eng, poisoned=False) is True  # next window


def test_wrapped_optimizer_skips_itself_and_an_applied_poisoned_step_is_an_error() -> None:
    eng = _Engine(_Wrapped(), applies=False)  # e.g. fp16 overflow / non-finite grads detected by DeepSpeed
    step_window(eng, poisoned=True)
    assert step_window(eng, poisoned=True) is False and eng.steps_taken == 1
    eng = _Engine(_Wrapped(), applies=True)
    step_window(eng, poisoned=True)
    with pytest.raises(RuntimeError, match="applied an optimizer step with non-finite gradients"):
        step_window(eng, poisoned=True)


def test_poisoned_loss_gives_nan_gradients_everywhere() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    poison((w * 2).sum()).backward()
    assert torch.isnan(w.grad).all()


def test_zero0_fp16_grad_norm_is_unscaled() -> None:
    """fp16 ZeRO-0 gradients carry the loss scale; the logged norm must be the true one."""
    eng = _Engine(_Wrapped())
    eng.module = torch.nn.Linear(3, 2).half()  # fp16 ZeRO-0 keeps fp16 params and grads
    true = [torch.randn(2, 3), torch.randn(2)]
    scale = 1024.0
    for p, g in zip(eng.module.parameters(), true):
        p.grad = (g * scale).half()
    want = float(torch.cat([g.flatten() for g in true]).norm())
    assert zero0_grad_norm(eng, scale) == pytest.approx(want, rel=1e-3)
    assert zero0_grad_norm(eng) == pytest.approx(want * scale, rel=1e-3)  # fp32 / bf16: no scale

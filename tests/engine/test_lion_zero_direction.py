"""DeepSpeed's Lion under the zero-direction guard: a weight whose gradient and momentum are both zero gets
the decoupled weight decay alone (bit-unchanged without decay), as AVION's ``sign_()`` leaves it; every
other weight moves as AVION's Lion moves it. On DeepSpeed's CPU Lion (the fused GPU one shares the
``copysign`` rule and the same guard)."""

from __future__ import annotations

import pytest
import torch

from avion_ds.engine.lion_guard import guard_zero_direction, is_deepspeed_lion
from tests.engine.test_optim_lion import avion_lion_step  # AVION's _single_tensor_lion, re-implemented


def _grads(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Embedding-like gradients: most rows zero; rows 0-1 get gradient at step 0 only (momentum, no grad
    later), and in the second tensor +g / -g rows whose direction cancels nowhere."""
    g = torch.zeros(64, 8)
    if step == 0:
        g[:2] = torch.linspace(-1, 1, 16).reshape(2, 8)
    g[5] = 0.25 * (step + 1)
    g[6, :4] = -0.5
    return g, g[:16].clone() * 3


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_zero_direction_weights_follow_avion(wd: float) -> None:
    from deepspeed.ops.lion import DeepSpeedCPULion

    torch.manual_seed(0)
    lr, betas = 1e-2, (0.9, 0.99)
    params = [torch.nn.Parameter(torch.randn(64, 8)), torch.nn.Parameter(torch.randn(16, 8))]
    plain = [torch.nn.Parameter(p.detach().clone()) for p in params]
    guarded = DeepSpeedCPULion([{"params": params, "weight_decay": wd}], lr=lr, betas=betas, weight_decay=wd)
    raw = DeepSpeedCPULion([{"params": plain, "weight_decay": wd}], lr=lr, betas=betas, weight_decay=wd)
    assert is_deepspeed_lion(guarded) and guard_zero_direction(guarded) is guarded
    ref = [p.detach().clone() for p in params]
    moments = [torch.zeros_like(p) for p in params]
    for step in range(3):
        for group, opt in ((params, guarded), (plain, raw)):
            for p, g in zip(group, _grads(step)):
                p.grad = g.clone()
            opt.step()
        for k, g in enumerate(_grads(step)):
            ref[k], moments[k] = avion_lion_step(ref[k], g, moments[k], lr, wd, *betas)
        for p, r, m in zip(params, ref, moments):
            still = (m == 0) & (p.grad == 0)  # zero momentum after the step and no gradient: direction was 0
            assert torch.equal(p.detach()[still], r[still])  # bit for bit, decay included
            torch.testing.assert_close(p.detach(), r, rtol=0, atol=1e-6)
    untouched = slice(7, 64)  # rows that never got a gradient
    if wd == 0.0:
        assert torch.equal(params[0].detach()[untouched], plain[0].detach()[untouched] * 0 + ref[0][untouched])
    drift = (plain[0].detach()[untouched] - ref[0][untouched]).abs().max().item()
    assert drift == pytest.approx(3 * lr, rel=1e-3)  # unguarded DeepSpeed Lion: lr per step (copysign on 0)


def test_guard_is_installed_once_and_leaves_a_plain_optimizer_alone() -> None:
    from deepspeed.ops.lion import DeepSpeedCPULion

    p = torch.nn.Parameter(torch.ones(4))
    opt = DeepSpeedCPULion([p], lr=0.1, weight_decay=0.0)
    guard_zero_direction(opt)
    step = opt.step
    assert guard_zero_direction(opt).step is step
    assert not is_deepspeed_lion(torch.optim.SGD([p], lr=0.1))
    p.grad = torch.tensor([0.0, 1.0, -1.0, 0.0])
    opt.step()
    assert p.detach().tolist() == pytest.approx([1.0, 0.9, 1.1, 1.0])

"""The temperature as AVION treats it (scripts/main_lavila_pretrain.py): the forward uses ``exp(t)`` as it
is, and ``t`` is clamped to [0, 4.6052] after each optimizer step (``logit_scale.data.clamp_(0, 4.6052)``),
on DeepSpeed's fp32 master weight too, so a ``t`` pushed past ln 100 keeps its gradient and comes back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from avion_ds.models import create_model
from avion_ds.models.clip.model import LOGIT_SCALE_MAX
from avion_ds.tasks.contrastive.losses import clip_loss
from avion_ds.tasks.contrastive.task import ContrastiveTask


def avion_step(t: float, grad: float, lr: float) -> float:
    """SGD on AVION's parameter, then its clamp_(0, 4.6052)."""
    return min(max(t - lr * grad, 0.0), 4.6052)


def test_a_temperature_past_ln100_gets_gradient_and_is_clamped_after_the_step() -> None:
    torch.manual_seed(0)
    model = create_model("clip_vit_test_tiny")
    with torch.no_grad():
        model.logit_scale.fill_(5.0)  # past ln 100, as a step can leave it
    frames, tokens = torch.randn(3, 3, 2, 32, 32), torch.randint(1, 400, (3, 77))
    out = model(frames, tokens)
    assert out.logit_scale.item() == pytest.approx(torch.tensor(5.0).exp().item())  # exp(t), no clamp inside
    loss, _ = clip_loss(out.video, out.text, out.logit_scale)
    loss.backward()
    grad = model.logit_scale.grad.item()
    assert grad != 0.0  # a clamp in the forward would leave exactly 0 here, and t could never come back
    opt = torch.optim.SGD([model.logit_scale], lr=0.5)
    opt.step()
    ContrastiveTask().after_step(SimpleNamespace(module=model, optimizer=opt))
    assert model.logit_scale.item() == pytest.approx(avion_step(5.0, grad, 0.5), abs=1e-6)
    assert LOGIT_SCALE_MAX == 4.6052
    with torch.no_grad():
        model.logit_scale.fill_(-0.3)
    ContrastiveTask().after_step(SimpleNamespace(module=model, optimizer=opt))
    assert model.logit_scale.item() == 0.0


def test_a_frozen_temperature_is_left_alone() -> None:
    model = create_model("clip_vit_test_tiny", freeze_logit_scale=True)
    with torch.no_grad():
        model.logit_scale.fill_(7.0)
    ContrastiveTask().after_step(SimpleNamespace(module=model, optimizer=None))
    assert model.logit_scale.item() == 7.0


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor([4.5]))
        self.w = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -100.0 * self.logit_scale.float().sum() + 0.0 * self.w(x).float().sum()


@pytest.mark.multiprocess  # a DeepSpeed engine in this process
@pytest.mark.parametrize(("stage", "bf16"), [(0, False), (2, True), (2, False), (3, False)])
def test_the_clamp_reaches_deepspeeds_master_weight(one_rank: None, stage: int, bf16: bool) -> None:
    """Under ZeRO-2 (bf16 or fp32) and ZeRO-3 the step starts from the fp32 partition: clamping the module tensor
    alone would be undone by the next step."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    from avion_ds.distributed import dist

    dist.init()
    torch.manual_seed(0)
    model = _Scale()
    config = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), config=config
    )
    x = torch.randn(1, 4, dtype=torch.bfloat16 if bf16 else torch.float32)
    for step in range(2):  # t grows by >= 1 per step without the clamp
        engine.backward(engine(x))
        engine.step()
        ContrastiveTask().after_step(engine)
        p = engine.module.logit_scale
        master = safe_get_full_fp32_param(p) if stage else p
        assert master.item() == pytest.approx(LOGIT_SCALE_MAX, abs=1e-6), step
        lp = p.ds_tensor if stage == 3 else p  # ZeRO-3: this rank's partition of the module tensor
        assert lp.float().item() == pytest.approx(LOGIT_SCALE_MAX, abs=2e-2), step

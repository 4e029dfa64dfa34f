"""``optim.name: lion``: DeepSpeed's own Lion (``deepspeed.ops.lion``) makes the updates AVION's Lion computes.

The oracle is AVION's ``avion/optim/lion.py`` (``_single_tensor_lion``), re-implemented below: decoupled weight
decay, then the sign of the momentum interpolated with the gradient, then the momentum update. Two steps,
so the second update's sign depends on the momentum the first one left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from avion_ds.engine.optim import param_groups
from avion_ds.engine.parallelize import unwrap
from tests.engine.tiny_trainer import batches, tiny_trainer

pytestmark = pytest.mark.multiprocess  # trains a DeepSpeed engine in this process


def avion_lion_step(
    param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, lr: float, wd: float, beta1: float, beta2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """AVION's ``_single_tensor_lion`` on copies: (new param, new exp_avg)."""
    param, exp_avg = param.clone(), exp_avg.clone()
    param.mul_(1 - lr * wd)
    update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
    param.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)
    return param, exp_avg


@pytest.mark.parametrize("config", ["zero0.json", "zero2_offload.json"])
def test_lion_follows_avions_update_rule(one_rank: None, tmp_path: Path, config: str) -> None:
    from deepspeed.utils import safe_get_full_grad

    betas = (0.9, 0.99)
    t = tiny_trainer(
        config,
        tmp_path / "run",
        "optim.name=lion",
        "optim.clip_grad=0",
        "optim.lr=0.01",
        "optim.scale_lr=false",
        "optim.weight_decay=0.5",  # large: a weight decay added to the gradient instead would flip signs
        f"optim.betas=[{betas[0]}, {betas[1]}]",
        "schedule.warmup_epochs=0",
        accum=1,
    )
    assert type(t.engine.basic_optimizer).__name__ == "DeepSpeedCPULion"
    model = unwrap(t.engine)
    groups = param_groups(model, t.recipe.optim.weight_decay, t.recipe.optim.layer_decay)
    assert len(groups) == len(t.engine.optimizer.param_groups)
    params = dict(model.named_parameters())
    momentum = {n: torch.zeros_like(p) for n, p in params.items()}
    data = batches()
    for _ in range(2):
        batch = next(data)
        loss, _ = t.task.loss(t.engine, batch["frames"], batch["label"], t.dtype, t.recipe)
        t.engine.backward(loss)
        expected = {}
        for g, live in zip(groups, t.engine.optimizer.param_groups):
            lr, wd = live["lr"], live["weight_decay"]
            assert wd == (0.5 if g["weight_decay"] else 0.0)
            for name in g["names"]:
                p = params[name]
                grad = safe_get_full_grad(p).detach().clone()
                expected[name], momentum[name] = avion_lion_step(p.detach(), grad, momentum[name], lr, wd, *betas)
        t.engine.step()
        for name, want in expected.items():
            torch.testing.assert_close(params[name].detach(), want, rtol=1e-6, atol=1e-7, msg=name)

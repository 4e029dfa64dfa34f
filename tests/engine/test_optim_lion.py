"""``optim.name: lion``: DeepSpeed's own Lion (``deepspeed.ops.lion``) makes the updates AVION's Lion computes.

The oracle is AVION's ``avion/optim/lion.py`` (``_single_tensor_lion``), re-implemented below: decoupled weight
decay, then the sign of the momentum interpolated with the gradient, then the momentum update. Two steps,
so the second update's sign depends on the momentum the first one left."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from avion_ds.distributed.ds_config import build_ds_config
from avion_ds.distributed.ds_optimizer import lion_needs_client
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.engine.optim import param_groups
from avion_ds.engine.parallelize import inner_module
from avion_ds.tasks import load_recipe
from tests.engine.tiny_trainer import REPO, batches, tiny_trainer


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


def test_optimizer_type_comes_from_the_recipe() -> None:
    """The shipped JSONs say ``"type": "auto"``: optim.name writes AdamW or Lion (Lion takes no eps)."""
    for name, want in (("adamw", "AdamW"), ("lion", "Lion")):
        recipe = load_recipe(None, ["data.dataset=kinetics", f"optim.name={name}"])
        cfg = build_ds_config(REPO / "ds_configs" / "zero2.json", recipe, 1)
        assert cfg["optimizer"]["type"] == want
        assert ("eps" in cfg["optimizer"]["params"]) == (name == "adamw")
        plan = DSPlan.of(cfg)
        assert lion_needs_client(plan, "cpu") == (name == "lion") and not lion_needs_client(plan, "cuda")
        offload = build_ds_config(REPO / "ds_configs" / "zero2_offload.json", recipe, 1)
        assert not lion_needs_client(DSPlan.of(offload), "cpu")  # DeepSpeed builds its CPU Lion from the JSON itself


@pytest.mark.multiprocess  # trains a DeepSpeed engine in this process
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
    model = inner_module(t.engine)
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

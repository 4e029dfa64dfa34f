"""``optim.name: sgd``: AVION's CLS optimizer (``scripts/main_lavila_finetune_cls.py`` lines 194-230).

AVION builds ``torch.optim.SGD(groups, lr, momentum=betas[0], weight_decay=wd)`` over two groups (decay: wd;
no decay: 0) and sets every group's lr from its schedule. The oracle below is that optimizer's update as
PyTorch documents it (coupled weight decay added to the gradient, momentum buffer = the first gradient, then
``momentum * buf + g``, no dampening, no Nesterov), run for two steps so the momentum matters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from avion_ds.distributed.ds_config import build_ds_config
from avion_ds.engine.optim import avion_no_decay
from avion_ds.engine.parallelize import inner_module
from avion_ds.tasks import load_recipe
from tests.engine.tiny_trainer import REPO, batches, tiny_trainer


def sgd_step(
    p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor | None, lr: float, wd: float, momentum: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.optim.SGD's documented update on copies: (new param, new momentum buffer)."""
    d = g + wd * p
    buf = d.clone() if buf is None else momentum * buf + d
    return p - lr * buf, buf


def test_sgd_is_written_into_the_deepspeed_config() -> None:
    """The shipped JSONs' "auto" optimizer becomes torch's SGD (momentum betas[0], no Nesterov, no Adam keys);
    ZeRO is told the optimizer is allowed, and its offload that SGD may run on the CPU partitions."""
    recipe = load_recipe(None, ["data.dataset=kinetics", "optim.name=sgd", "optim.betas=[0.8, 0.999]"])
    z0 = build_ds_config(REPO / "ds_configs" / "zero0.json", recipe, 1)
    assert z0["optimizer"]["type"] == "SGD"
    assert {k: v for k, v in z0["optimizer"]["params"].items() if k != "lr"} == {
        "momentum": 0.8,
        "nesterov": False,
        "weight_decay": recipe.optim.weight_decay,
    }
    assert "zero_allow_untested_optimizer" not in z0
    offload = build_ds_config(REPO / "ds_configs" / "zero2_offload.json", recipe, 1)
    assert offload["zero_allow_untested_optimizer"] is True and offload["zero_force_ds_cpu_optimizer"] is False


@pytest.mark.multiprocess  # trains a DeepSpeed engine in this process
@pytest.mark.parametrize("config", ["zero0.json", "zero2_offload.json"])
def test_sgd_follows_avions_optimizer(one_rank: None, tmp_path: Path, config: str) -> None:
    from deepspeed.utils import safe_get_full_grad

    momentum, wd = 0.9, 0.3  # a large decay: decay on the wrong group shows at once
    t = tiny_trainer(
        config,
        tmp_path / "run",
        "optim.name=sgd",
        "optim.clip_grad=0",
        "optim.lr=0.05",
        "optim.scale_lr=false",
        f"optim.weight_decay={wd}",
        "optim.layer_decay=1.0",
        "optim.no_decay=avion",
        f"optim.betas=[{momentum}, 0.999]",
        "schedule.warmup_epochs=0",
        accum=1,
    )
    assert type(t.engine.basic_optimizer) is torch.optim.SGD
    model = inner_module(t.engine)
    live = t.engine.optimizer.param_groups
    assert len(live) == 2  # decay / no decay, no per-layer groups
    assert all(g["momentum"] == momentum and g["nesterov"] is False and g["dampening"] == 0 for g in live)
    params = dict(model.named_parameters())
    decayed = {n for n, p in params.items() if not avion_no_decay(n, p)}
    assert decayed and decayed != set(params)
    buffers: dict[str, torch.Tensor | None] = dict.fromkeys(params)
    data = batches()
    for _ in range(2):
        batch = next(data)
        loss, _ = t.task.loss(t.engine, batch["frames"], batch["label"], t.dtype, t.recipe)
        t.engine.backward(loss)
        lr = live[0]["lr"]
        assert live[1]["lr"] == lr
        expected = {}
        for name, p in params.items():
            grad = safe_get_full_grad(p).detach().clone()
            decay = wd if name in decayed else 0.0
            expected[name], buffers[name] = sgd_step(p.detach().clone(), grad, buffers[name], lr, decay, momentum)
        t.engine.step()
        for name, want in expected.items():
            torch.testing.assert_close(params[name].detach(), want, rtol=1e-5, atol=1e-7, msg=name)

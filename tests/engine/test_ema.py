"""``ema.decay``: an EMA of the fp32 master weights (timm ``ModelEmaV2``'s rule, as VideoMAE / AVION fine-tuning),
checkpointed and resumed bit-exactly, used by validation and export as ``ema.weights`` says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from avion_ds.config import save_recipe
from avion_ds.engine.ema import EmaFiles, _copy_overlap
from avion_ds.engine.export import export, run_weights
from avion_ds.engine.parallelize import inner_module
from avion_ds.engine.train_state import TrainData
from avion_ds.storage.run_dir import consolidate
from avion_ds.tasks import EvalContext, EvalOutcome, load_recipe, task_of
from tests.engine.tiny_trainer import batches, tiny_trainer

ENGINE = pytest.mark.multiprocess  # trains a DeepSpeed engine in this process
DECAY = 0.9


def timm_ema_v2_update(ema: dict[str, torch.Tensor], model: dict[str, torch.Tensor], decay: float) -> None:
    """timm ``ModelEmaV2._update(model, update_fn=lambda e, m: decay * e + (1. - decay) * m)``."""
    for k, ema_v in ema.items():
        ema_v.copy_(decay * ema_v + (1.0 - decay) * model[k])


def masters(engine: Any) -> dict[str, torch.Tensor]:
    """The fp32 master weights, through DeepSpeed's own accessor (independent of ``engine.ema``)."""
    from deepspeed.utils import safe_get_full_fp32_param

    return {n: safe_get_full_fp32_param(p).detach().clone() for n, p in inner_module(engine).named_parameters()}


def ema_of(trainer: Any) -> dict[str, torch.Tensor]:
    return {s.name: s.ema.view(s.shape).clone() for s in trainer.ema.slots}


@ENGINE
def test_ema_follows_timm_rule_resumes_bit_exactly_and_exports(one_rank: None, tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = [f"ema.decay={DECAY}", "model.drop_path_rate=0"]  # no randomness: the resumed run repeats the first
    t = tiny_trainer("zero2.json", run, *sets, accum=1)
    ref = masters(t.engine)  # the EMA starts as the weights the engine was built with
    data = batches()
    for _ in range(3):
        assert t.train_step(data)
        timm_ema_v2_update(ref, masters(t.engine), DECAY)
    got = ema_of(t)
    assert sorted(got) == sorted(ref)
    for name, want in ref.items():
        torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-8, msg=name)
    assert max((got[n] - masters(t.engine)[n]).abs().max() for n in got) > 0  # the average lags the weights

    tag = t.save()
    fresh = tiny_trainer("zero2.json", run, *sets, accum=1)
    assert fresh.resume()
    assert fresh.ema.updates == t.ema.updates == 3
    assert all(torch.equal(a, ema_of(t)[n]) for n, a in ema_of(fresh).items())  # bit-exact
    batch = next(data)
    for trainer in (t, fresh):  # the same next step on both: still bit-equal
        assert trainer.train_step(iter([batch]))
    assert all(torch.equal(a, ema_of(t)[n]) for n, a in ema_of(fresh).items())

    from safetensors.torch import load_file

    model = consolidate(run, tag)
    for weights, want in (("ema", {**model, **got}), ("model", model)):
        for suffix in (".safetensors", ".pt"):  # streamed (ZeRO 1/2) and consolidated in memory
            out = export(run, tmp_path / f"{weights}{suffix}", tag, weights=weights)
            sd = load_file(str(out)) if suffix == ".safetensors" else torch.load(out)["state_dict"]
            assert sorted(sd) == sorted(want)
            assert all(torch.equal(sd[k], want[k].float()) for k in want), (weights, suffix)


@ENGINE
def test_zero0_bf16_ema_follows_the_wrappers_fp32_master(one_rank: None, tmp_path: Path) -> None:
    """ZeRO-0 bf16: the module holds bf16 copies; the EMA follows the optimizer wrapper's fp32 masters."""
    t = tiny_trainer("zero0.json", tmp_path / "run", "ema.decay=0.5", "precision=bf16", accum=1)
    opt = t.engine.optimizer  # DeepSpeed's FP16_UnfusedOptimizer here (torch AdamW): fp32 copies per parameter
    pairs = [(p, m) for params, fp32 in zip(opt.fp16_groups, opt.fp32_groups) for p, m in zip(params, fp32)]
    assert pairs and all(p.dtype == torch.bfloat16 and m.dtype == torch.float32 for p, m in pairs)
    ref = {id(p): m.detach().clone() for p, m in pairs}
    data = batches()
    for _ in range(3):
        assert t.train_step(data)
        for p, m in pairs:
            ref[id(p)] = 0.5 * ref[id(p)] + 0.5 * m.detach()
    for s in t.ema.slots:
        torch.testing.assert_close(s.ema.view(s.shape), ref[id(s.param)], rtol=1e-6, atol=1e-8, msg=s.name)


class _Recording:
    """Wraps the fine-tuning task: ``evaluate`` records the weights the model holds."""

    def __init__(self, recipe: Any) -> None:
        self.inner, self.seen = task_of(recipe), {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        self.seen = {n: p.detach().clone() for n, p in inner_module(ctx.model).named_parameters()}
        return EvalOutcome(metrics={"top1": 0.0})


@ENGINE
@pytest.mark.parametrize("weights", ["ema", "model"])
def test_validation_uses_the_chosen_weights_then_restores(one_rank: None, tmp_path: Path, weights: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    sets = ["ema.decay=0.5", f"ema.weights={weights}"]
    task = _Recording(load_recipe(None, ["data.dataset=kinetics", *sets]))
    t = tiny_trainer("zero0.json", run, *sets, accum=1, task=task)
    data = batches()
    for _ in range(2):
        assert t.train_step(data)
    before = {n: p.detach().clone() for n, p in inner_module(t.engine).named_parameters()}
    t.evaluate(TrainData(None, None, None, None, None, 1))  # type: ignore[arg-type]
    want = ema_of(t) if weights == "ema" else before
    assert all(torch.equal(task.seen[n], want[n]) for n in before)
    assert any(not torch.equal(ema_of(t)[n], before[n]) for n in before)  # the two differ here
    assert all(torch.equal(p, before[n]) for n, p in inner_module(t.engine).named_parameters())  # restored
    assert json.loads((run / "metrics.json").read_text())["weights"] == weights


def test_fragments_assemble_across_world_sizes(tmp_path: Path) -> None:
    """Files of 2 ranks (ZeRO-1/2 fragments at offsets) give back the whole tensor, and any other
    partition (another world size) copies exactly its own part."""
    full = torch.arange(10, dtype=torch.float32)
    for r, (start, n) in enumerate(((0, 6), (6, 4))):
        part = {"shape": [2, 5], "start": start, "value": full[start : start + n].clone()}
        torch.save({"decay": 0.9, "updates": 1, "world_size": 2, "params": {"w": part}}, tmp_path / f"ema_rank{r}.pt")
    assert torch.equal(EmaFiles(tmp_path).get("w"), full.view(2, 5))
    files = EmaFiles(tmp_path)
    mine = torch.zeros(3)  # elements [4, 7) of a 3-way partition
    copied = sum(_copy_overlap(mine, 4, st["params"]["w"]) for st in files.states)
    assert copied == 3 and torch.equal(mine, full[4:7])


def test_export_defaults_to_the_runs_ema_weights(tmp_path: Path) -> None:
    assert run_weights(tmp_path) == "model"  # no recipe.yaml
    for sets, want in (
        ([], "model"),
        (["ema.decay=0.9999"], "ema"),
        (["ema.decay=0.9999", "ema.weights=model"], "model"),
    ):
        save_recipe(load_recipe(None, ["data.dataset=kinetics", *sets]), tmp_path / "recipe.yaml")
        assert run_weights(tmp_path) == want, sets

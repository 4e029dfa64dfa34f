"""Zero-shot benchmarks are objects the task asks (``tasks/zero_shot/benchmarks.py``): each set's metric keys,
targets and report; a dataset declares its protocol kind, the task names no dataset; an unknown set is one
line; a plugin-registered kind named by a dataset is used with no change to the task.
The metric values themselves are checked against LaViLa's formulas in tests/engine/test_zero_shot.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import avion_ds.tasks  # noqa: F401 - registers the tasks
from avion_ds.config import ConfigError, recipe_from_dict
from avion_ds.data.datasets import registry
from avion_ds.tasks.registry import get_task
from avion_ds.tasks.zero_shot import benchmarks as zb
from avion_ds.tasks.zero_shot.task import ZEROSHOT_DEFAULTS, benchmark
from tests.engine.test_zero_shot import ref_compute_map


def _recipe(val_dataset: str):
    return recipe_from_dict({"task": "zeroshot", "data": {"val_dataset": val_dataset}}, ZEROSHOT_DEFAULTS)


def test_registered_sets() -> None:
    assert zb.zero_shot_benchmarks() == ("epic", "egtea", "charades_ego")
    kinds = {"epic": "epic_actions", "egtea": "single_label", "charades_ego": "multi_label_map"}
    for name in zb.zero_shot_benchmarks():
        bench = benchmark(_recipe(name))
        assert (bench.name, bench.kind) == (name, kinds[name])


def test_unknown_set_is_one_line() -> None:
    with pytest.raises(
        ConfigError, match=r"^data.val_dataset='ssv2': task=zeroshot classifies epic, egtea, charades_ego"
    ):
        get_task("zeroshot").validate_recipe(_recipe("ssv2"))


def test_epic_targets_metrics_and_report() -> None:
    bench = zb.zero_shot_benchmark("epic")
    ds = type("DS", (), {"zero_shot_action_ids": {"0:1": 0, "1:0": 1}})()
    t = bench.targets({"verb": torch.tensor([0, 1, 1]), "noun": torch.tensor([1, 0, 1])}, ds)
    assert t["action"].tolist() == [0, 1, -1]  # 1:1 is not an action class
    scores = {h: torch.eye(3)[:, :2] if h == "action" else torch.eye(3) for h in ("verb", "noun", "action")}
    labels = {"verb": torch.tensor([0, 1, 2]), "noun": torch.tensor([0, 0, 2]), "action": t["action"]}
    m, extra = bench.results(scores, labels)
    assert set(m) == {f"{h}_{k}" for h in ("verb", "noun", "action") for k in ("top1", "top5", "mean_class")}
    assert m["verb_top1"] == 100.0 and m["noun_top1"] == pytest.approx(200 / 3)
    assert extra == {"action_rows_outside_classes": 1}


def test_egtea_keys_unprefixed() -> None:
    bench = zb.zero_shot_benchmark("egtea")
    m, extra = bench.results({"egtea": torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])}, torch.tensor([0, 1, 1]))
    assert extra == {}
    assert set(m) == {"top1", "top5", "mean_class"}
    assert m["top1"] == pytest.approx(200 / 3) and m["mean_class"] == pytest.approx(75.0)


def test_charades_map_and_classes_without_positives() -> None:
    bench = zb.zero_shot_benchmark("charades_ego")
    rng = np.random.default_rng(0)
    scores = rng.random((6, 4)).astype(np.float32)
    gt = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0], [1, 0, 0, 0]])
    m, extra = bench.results({"charades_ego": torch.from_numpy(scores)}, torch.from_numpy(gt))
    _, aps = ref_compute_map(np.array(scores, dtype=np.float64), gt)
    assert m == {"map": pytest.approx(100 * float(np.nanmean(aps)))}
    assert extra == {"classes_without_positives": 1}


def test_plugin_benchmark_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zb, "_KINDS", dict(zb._KINDS))
    specs = dict(registry._SPECS)
    monkeypatch.setattr(registry, "_SPECS", specs)

    @zb.register_zero_shot_benchmark
    class TopOne(zb.ZeroShotBenchmark):
        kind = "top1_only"
        metrics_text = "top-1 only"

        def results(self, scores, labels):
            return {"top1": float((scores[self.name].argmax(1) == labels).float().mean() * 100)}, {"k": 1}

    specs["kinetics"] = dataclasses.replace(specs["kinetics"], zero_shot="top1_only")  # as its class would declare
    recipe = _recipe("kinetics")
    get_task("zeroshot").validate_recipe(recipe)
    assert benchmark(recipe).results({"kinetics": torch.eye(2)}, torch.tensor([0, 0])) == ({"top1": 50.0}, {"k": 1})
    with pytest.raises(ValueError, match="needs a kind"):
        zb.register_zero_shot_benchmark(type("Kindless", (zb.ZeroShotBenchmark,), {}))
    specs["kinetics"] = dataclasses.replace(specs["kinetics"], zero_shot="nobody_registered")
    with pytest.raises(ConfigError, match=r"^data.val_dataset='kinetics': dataset 'kinetics': zero_shot_protocol="):
        get_task("zeroshot").validate_recipe(_recipe("kinetics"))

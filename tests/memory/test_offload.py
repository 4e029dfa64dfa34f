"""ZeRO-3 parameter-offload inference (layer streaming) on 2 CPU ranks: logits equal the plain model."""

import json
from pathlib import Path

import pytest
import torch

from avion_ds.memory.offload import inference_ds_config
from tests.helpers import launch


def test_inference_config_exposes_the_two_knobs():
    cfg = inference_ds_config("cpu", max_live_parameters=123, prefetch_bucket_size=45, dtype=torch.bfloat16)
    zo = cfg["zero_optimization"]
    assert zo["stage"] == 3 and zo["offload_param"]["device"] == "cpu"
    assert zo["stage3_max_live_parameters"] == 123 and zo["stage3_prefetch_bucket_size"] == 45
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"] and "optimizer" not in cfg


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"offload": "gpu"}, "offload='gpu'"),
        ({"offload": "nvme"}, "needs nvme_path"),
        ({"max_live_parameters": 0}, "max_live_parameters=0"),
        ({"prefetch_bucket_size": -1}, "prefetch_bucket_size=-1"),
    ],
)
def test_inference_config_bad_input(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        inference_ds_config(**kwargs)


@pytest.mark.multiprocess
def test_two_rank_offloaded_logits_equal_plain_model(tmp_path):
    proc = launch(
        [tmp_path], launcher="torchrun", script_path=Path(__file__).with_name("_offload_worker.py"), timeout=240
    )
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(results) == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    for r in results:
        assert r["allclose"], r
        assert r["heads_diff"] < 1e-5, r
        assert r["released"], r  # weights are not resident outside forward
    # each rank holds about half of the weights (ZeRO-3 partitions, padded to the world size)
    assert sum(r["local_params"] for r in results) >= results[0]["total_params"]
    assert all(r["local_params"] <= results[0]["total_params"] // 2 + 64 for r in results)


@pytest.mark.parametrize("offload, name", [("cpu", "zero3_offload"), ("nvme", "zero3_nvme")])
def test_inference_config_is_the_reference_json_without_optimizer(offload, name):
    """Knobs at the JSON's own values: the inference config is the builder's output from
    ds_configs/<name>.json minus the optimizer sections (and train_batch_size, left to DeepSpeed)."""
    from avion_ds.config import BatchConfig, Recipe
    from avion_ds.distributed.ds_config import build_ds_config

    path = Path(__file__).resolve().parents[2] / "ds_configs" / f"{name}.json"
    ref_zo = json.loads(path.read_text())["zero_optimization"]
    knobs = {
        "max_live_parameters": ref_zo["stage3_max_live_parameters"],
        "prefetch_bucket_size": ref_zo["stage3_prefetch_bucket_size"],
        "param_persistence_threshold": ref_zo["stage3_param_persistence_threshold"],
        "pin_memory": True,
        "nvme_path": ref_zo["offload_param"].get("nvme_path"),
    }
    got = inference_ds_config(offload, dtype=torch.float16, **knobs)
    recipe = Recipe(precision="fp16", batch=BatchConfig(global_batch=None, micro_batch=1, grad_accum=1))
    ref = build_ds_config(path, recipe, 1)
    del ref["optimizer"], ref["zero_optimization"]["offload_optimizer"], ref["train_batch_size"]
    assert got == ref

"""ZeRO-3 partitioned construction (``zero.Init``) and sharded pretrained loading on 2 CPU ranks.

One torchrun of ``zero_init_script.py``; each test checks one promise against the normally built
(unpartitioned) model as the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import launch

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("deepspeed")
    tmp = tmp_path_factory.mktemp("zero_init")
    proc = launch([tmp], launcher="torchrun", script_path=Path(__file__).with_name("zero_init_script.py"), timeout=280)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(line[len("RESULT ") :])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["default", "cls_learned_heads"])
def test_partitioned_at_construction_with_identical_init(result: dict, case: str) -> None:
    r = result[case]
    assert r["all_partitioned"]  # built partitioned, not partitioned afterwards
    assert r["local_fraction"] == pytest.approx(0.5, abs=0.01)  # each of 2 ranks holds half
    assert r["param_max_diff"] == 0.0  # trunc-normal / zero-init / head scaling ran on the gathered tensors
    assert r["logits_max_diff"] == 0.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["default", "cls_learned_heads"])
def test_shape_users_see_full_shapes(result: dict, case: str) -> None:
    r = result[case]
    assert r["shapes_equal"] and r["count_equal"]
    assert r["num_no_wd"] > 10 and r["no_wd_equal"] and r["groups_equal"]


@pytest.mark.timeout(300)
def test_bf16_sincos_table_not_collapsed(result: dict) -> None:
    r = result["bf16"]
    assert r["weight_dtype"] == "torch.bfloat16"  # zero.Init really ran in bf16
    assert r["distinct_1560_1567"] == 8
    assert r["table_max_diff"] == 0.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("impl", ["None", "torch", "deepspeed"])
def test_training_on_partitioned_model_follows_plain(result: dict, impl: str) -> None:
    plain = result["train_plain"]  # ZeRO-0, unpartitioned, no checkpointing, same groups (layer decay)
    assert plain[0] > 1e-3 and plain[0] != plain[-1]
    assert result["train"][impl] == pytest.approx(plain, rel=1e-5, abs=1e-7)


@pytest.mark.timeout(300)
def test_pretrained_into_shards_equals_plain_load(result: dict) -> None:
    r = result["load"]
    assert r["part_report"] == r["plain_report"]
    assert r["resized"] == ["pos_embed"] and r["dropped"] == ["head.bias", "head.weight"]
    assert r["param_max_diff"] == 0.0 and r["logits_max_diff"] == 0.0


@pytest.mark.timeout(300)
def test_same_size_safetensors_streams_into_shards(result: dict) -> None:
    r = result["load"]["safetensors"]
    assert r["part_report"] == r["plain_report"] == "format=avion_ds"
    assert r["param_max_diff"] == 0.0

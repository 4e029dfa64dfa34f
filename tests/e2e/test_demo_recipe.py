"""The demo's recipe resolves the same on every CPU.

What the training path asks the machine: DeepSpeed's CPU accelerator (``is_fp16_supported`` is oneDNN's fp16
answer: yes on Intel with AVX-512 FP16 / AMX, no on AMD EPYC; ``is_bf16_supported``), torch's oneDNN and
CPU-capability answers, and the speed of the decoders (``data.decoder=auto`` probes them). Each answer is
forced both ways here; the demo must still train in fp32 with the same DeepSpeed config, the same attention
backend and the same decoder, so that two CPUs differ only in rounding, which the demo's recipe tolerates
(the README doc test in ``tests/e2e/test_docs_commands.py`` runs the demo in full and checks >= 95).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from avion_ds.config import Recipe
from avion_ds.data.decode import select
from avion_ds.distributed.ds_config import build_ds_config
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.engine.preflight import check_runtime
from avion_ds.models.attention import resolve_backend
from avion_ds.models.registry import registered_arch
from avion_ds.tasks import load_recipe

REPO = Path(__file__).resolve().parents[2]
DEMO_RECIPE = REPO / "launch" / "recipes" / "demo_cpu.yaml"
ZERO2 = REPO / "ds_configs" / "zero2.json"
STEPS_PER_EPOCH = 18  # 288 train clips / global batch 16

# (oneDNN fp16, bf16, oneDNN present, torch CPU capability): what the CPUs report
CPUS = {
    "intel_avx512_fp16": (True, True, True, "AVX512"),
    "amd_epyc_no_fp16": (False, True, True, "AVX512"),
    "avx2_no_fp16": (False, True, True, "AVX2"),
    "no_onednn": (False, False, False, "DEFAULT"),
}


def _force(monkeypatch: pytest.MonkeyPatch, fp16: bool, bf16: bool, onednn: bool, capability: str) -> None:
    """Make DeepSpeed's accelerator and torch report the given CPU capabilities."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() != "cpu":
        pytest.skip("the demo runs on DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu, as launch/demo.sh sets)")
    monkeypatch.setattr(acc, "is_fp16_supported", lambda: fp16)
    monkeypatch.setattr(acc, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: onednn)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)


def _demo_recipe() -> Recipe:
    """The demo's recipe as launch/demo.sh runs it (paths do not matter here)."""
    return load_recipe(DEMO_RECIPE)


@pytest.fixture(params=sorted(CPUS))
def cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each CPU of ``CPUS`` in turn, forced."""
    _force(monkeypatch, *CPUS[request.param])
    yield request.param


def _resolved(recipe: Recipe) -> dict[str, Any]:
    """The demo's complete DeepSpeed config for 2 CPU ranks."""
    return build_ds_config(ZERO2, recipe, world_size=2, steps_per_epoch=STEPS_PER_EPOCH)


def test_forcing_reaches_deepspeed(cpu: str) -> None:
    """The forced answers are what DeepSpeed's accelerator reports (the patch is not a no-op)."""
    from deepspeed.accelerator import get_accelerator

    fp16, bf16, onednn, capability = CPUS[cpu]
    acc = get_accelerator()
    assert acc.device_name() == "cpu"
    assert (acc.is_fp16_supported(), acc.is_bf16_supported()) == (fp16, bf16)
    assert torch.backends.mkldnn.is_available() == onednn
    assert torch.backends.cpu.get_cpu_capability() == capability


def test_demo_trains_fp32_with_one_config(cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CPU: fp32 (no fp16 / bf16 section enabled) and the same config as an fp16-capable Intel CPU."""
    recipe = _demo_recipe()
    cfg = _resolved(recipe)
    assert DSPlan.of(cfg).precision == "fp32"
    assert cfg["fp16"]["enabled"] is False and cfg["bf16"]["enabled"] is False
    check_runtime(recipe, "fp32", "cpu")  # the start-up check passes whatever the accelerator reports
    with monkeypatch.context() as m:
        _force(m, *CPUS["intel_avx512_fp16"])
        reference = _resolved(_demo_recipe())
    assert cfg == reference


def test_demo_attention_backend_is_sdpa(cpu: str) -> None:
    recipe = _demo_recipe()
    head_dim = registered_arch(recipe.model.name).head_dim
    assert resolve_backend(recipe.model.attn_backend, "cpu", torch.float32, head_dim) == "sdpa"


def test_demo_decoder_is_pinned_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.decoder=auto`` would pick the fastest backend by timing (another CPU, another load, maybe
    another decoder with other resampling); the demo names one that its install check guarantees."""
    recipe = _demo_recipe()
    assert recipe.data.decoder == "pyav"
    assert recipe.data.decoder in select.available_backends()

    def no_probe(*_a: object, **_k: object) -> dict[str, float]:
        raise AssertionError("the demo's decoder must not depend on a timing probe")

    monkeypatch.setattr(select, "probe_backends", no_probe)
    name, reason = select.pick_decoder(recipe.data)
    assert name == "pyav" and "from the recipe" in reason
    needs = (REPO / "launch" / "demo.sh").read_text().split('NEEDS="', 1)[1].split('"', 1)[0]
    assert "av" in needs.split()  # demo.sh installs when PyAV is missing

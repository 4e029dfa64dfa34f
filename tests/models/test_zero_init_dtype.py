"""Partitioned construction builds parameters in the CONFIG's dtype, whatever the accelerator reports.

DeepSpeed 0.19.8's ``zero.Init`` drops an explicit ``dtype`` when the accelerator reports no fp16
(CPUs without oneDNN fp16, e.g. AMD EPYC): an fp32 run got bf16 parameters and crashed at the first
forward. Both answers of ``is_fp16_supported`` are patched in here, so the suite catches it on any CPU.
"""

from __future__ import annotations

import pytest
import torch

from avion_ds.distributed import dist
from avion_ds.models import create_model
from avion_ds.models.partition import gathered, partitioned_construction

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def zero3_config(precision: str) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


# an fp16 config where fp16 is reported absent is refused by preflight, so it is not a case here
CASES = [(p, s) for p in ("fp32", "bf16", "fp16") for s in (False, True) if p != "fp16" or s]


@pytest.mark.parametrize(("precision", "fp16_supported"), CASES)
def test_partitioned_parameters_have_the_configs_dtype(
    one_rank: None, monkeypatch: pytest.MonkeyPatch, fp16_supported: bool, precision: str
) -> None:
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: fp16_supported)
    dist.init()
    torch.manual_seed(0)
    with partitioned_construction(zero3_config(precision)) as partitioned:
        model = create_model("vit_test_tiny", num_frames=2, img_size=32, num_classes=3)
    assert partitioned
    want = DTYPES[precision]
    dtypes = {n: p.ds_tensor.dtype for n, p in model.named_parameters()}
    assert set(dtypes.values()) == {want}, dtypes
    if precision == "fp32":  # the forward that crashed ("expected m1 and m2 to have the same dtype")
        with gathered(list(model.parameters())):
            out = model(torch.randn(1, 3, 2, 32, 32))
        assert out.dtype == torch.float32 and torch.isfinite(out).all()

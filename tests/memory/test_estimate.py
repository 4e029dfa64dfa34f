"""Model-state accounting follows DeepSpeed's estimators; the parts add up; bad combinations fail."""

import pytest
import torch

from avion_ds.memory.estimate import activation_bytes_per_clip, arch_info, estimate


def _states(e):
    return e.params + e.grads + e.optimizer


@pytest.mark.parametrize("world", [1, 8])
def test_zero2_zero3_model_states_equal_deepspeed_estimators(world):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
    )

    info = arch_info("vit_base_patch16_224")
    p = info.params
    for off in (False, True):
        e = estimate("vit_base_patch16_224", 16, 224, 1, "bf16", 2, off, False, False, world)
        host, gpu = estimate_zero2_model_states_mem_needs(p, min(world, 8), 1, cpu_offload=off)
        assert _states(e) == gpu and e.host == host
    # ZeRO-3 with the live-parameter window no larger than DeepSpeed's 4 x largest layer
    e = estimate(
        "vit_base_patch16_224",
        16,
        224,
        1,
        "bf16",
        3,
        True,
        True,
        False,
        world,
        max_live_parameters=1,
        prefetch_bucket_size=1,
    )
    host, gpu, _ = estimate_zero3_model_states_mem_needs(p, info.largest_layer_params, min(world, 8), 1, True, True)
    assert _states(e) == gpu and e.host == host


def test_parts_add_up_and_stages_shrink_memory():
    prev = None
    for stage in (0, 1, 2, 3):
        e = estimate("vit_large_patch16_224", 16, 224, 4, torch.bfloat16, stage, False, False, True, 8)
        assert e.allocated_peak == sum(
            getattr(e, k) for k in ("params", "grads", "optimizer", "activations", "recompute", "workspace")
        )
        assert e.total == e.allocated_peak + e.fragmentation + e.context
        if prev is not None:
            assert _states(e) < _states(prev)
        prev = e


def test_offload_moves_states_to_host_and_checkpointing_cuts_activations():
    base = estimate("vit_huge_patch16_224", 16, 224, 2, "bf16", 3, False, False, False, 4)
    off = estimate("vit_huge_patch16_224", 16, 224, 2, "bf16", 3, True, True, False, 4)
    ck = estimate("vit_huge_patch16_224", 16, 224, 2, "bf16", 3, False, False, True, 4)
    assert _states(off) < _states(base) and off.host > base.host
    assert ck.activations < 0.2 * base.activations and ck.recompute > 0 and base.recompute == 0
    assert ck.activations == 2 * activation_bytes_per_clip(arch_info("vit_huge_patch16_224"), 16, 224, "bf16", True)


def test_fp32_and_micro_batch_scaling():
    e1 = estimate("vit_small_patch16_224", 8, 224, 1, "fp32", 0)
    e4 = estimate("vit_small_patch16_224", 8, 224, 4, "fp32", 0)
    p = arch_info("vit_small_patch16_224").params
    assert _states(e1) == 16 * p
    assert e4.activations == 4 * e1.activations


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"zero_stage": 2, "offload_param": True}, "offload_param needs zero_stage=3"),
        ({"zero_stage": 0, "offload_optimizer": True}, "offload_optimizer needs zero_stage >= 1"),
        ({"zero_stage": 5}, "zero_stage=5"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"frames": 15}, "got 15"),
    ],
)
def test_bad_inputs(kwargs, fragment):
    args = {"model": "vit_base_patch16_224", "frames": 16, "size": 224, "micro_batch": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        estimate(**args)

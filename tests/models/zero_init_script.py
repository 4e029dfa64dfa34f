"""Run by test_zero_init.py on 2 CPU ranks (torchrun): builds vit_test_tiny under ``zero.Init`` and
compares it with the normally built model. Prints ``RESULT <json>`` on rank 0.

Checks: parameters and logits equal (fp32, same seed); every parameter partitioned at construction;
no-weight-decay / layer-decay groups and parameter counts equal; bf16 sin-cos table intact;
training with both activation-checkpointing impls follows the plain model; pretrained loading
into the partitioned model (VideoMAE format, pos-embed resize, head dropped) equals the plain load
and only rank 0 reads the file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from ds_steps import checkpointed_losses  # next to this script (run as a subprocess)

from avion_ds.engine.optim import param_groups
from avion_ds.models import (
    apply_activation_checkpointing,
    count_params,
    create_model,
    load_weights,
)
from avion_ds.models.partition import (
    full_shape,
    gathered,
    is_partitioned,
    partitioned_construction,
)
from avion_ds.models.vit.model import sincos_table
from avion_ds.models.weights.loading import build_partitioned

WORLD = int(os.environ["WORLD_SIZE"])


def config(precision: str = "fp32", stage: int = 3) -> dict:
    return {
        "train_batch_size": 2 * WORLD,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "bf16": {"enabled": precision == "bf16"},
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False},
    }


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        with gathered([p], modifier_rank=None):
            out[n] = p.data.detach().clone()
    return out


def clip() -> torch.Tensor:
    return torch.randn(2, 3, 4, 32, 32, generator=torch.Generator().manual_seed(5))


def max_diff(a: object, b: object) -> float:
    if isinstance(a, dict):
        return max(max_diff(a[k], b[k]) for k in a)
    return float((a.float() - b.float()).abs().max())


def groups_signature(model: torch.nn.Module) -> list:
    return [(g["names"], g["weight_decay"], g["lr_scale"]) for g in param_groups(model, 0.05, 0.75)]


def construction(kw: dict) -> dict:
    torch.manual_seed(0)
    plain = create_model("vit_test_tiny", **kw).eval()
    torch.manual_seed(0)
    with partitioned_construction(config()):
        part = create_model("vit_test_tiny", **kw)
    local = sum(p.ds_tensor.numel() for p in part.parameters())
    res = {
        "all_partitioned": all(is_partitioned(p) and p.data.numel() == 0 for p in part.parameters()),
        "local_fraction": local / count_params(plain),
        "param_max_diff": max_diff(dict(plain.named_parameters()), full_params(part)),
        "shapes_equal": all(full_shape(q) == p.shape for p, q in zip(plain.parameters(), part.parameters())),
        "count_equal": count_params(part) == count_params(plain),
        "no_wd_equal": part.no_weight_decay() == plain.no_weight_decay(),
        "groups_equal": groups_signature(part) == groups_signature(plain),
        "num_no_wd": len(plain.no_weight_decay()),
    }
    engine, *_ = deepspeed.initialize(model=part, config=config())
    engine.eval()
    with torch.no_grad():
        res["logits_max_diff"] = max_diff(plain(clip()), engine(clip()))
    return res


def bf16_table() -> dict:
    kw = {"num_frames": 16, "img_size": 224}  # 8 x 14 x 14 = 1568 positions, as ViT-B 16x224
    with partitioned_construction(config("bf16")):
        part = create_model("vit_test_tiny", **kw)
    table = part.pos_embed.float()[0]
    ref = sincos_table(1568, 64)[0]
    return {
        "table_max_diff": float((table - ref.to(part.pos_embed.dtype).float()).abs().max()),
        "distinct_1560_1567": len({tuple(r.tolist()) for r in table[1560:1568]}),
        "weight_dtype": str(next(part.parameters()).dtype),
    }


def train_losses(partitioned: bool, impl: str | None) -> list[float]:
    kw = {"layer_scale": 0.1, "drop_path_rate": 0.0, "heads": {"verb": 3, "noun": 2}, "head_init_scale": 1.0}
    torch.manual_seed(0)
    cfg = config(stage=3 if partitioned else 0)
    with partitioned_construction(cfg if partitioned else None):
        model = create_model("vit_test_tiny", **kw)
    if impl:
        apply_activation_checkpointing(model, impl=impl)
    groups = param_groups(model, 0.05, 0.75)
    for g in groups:
        g["lr"] = 1e-2 * g["lr_scale"]
        del g["names"]
    opt = torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.05)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return checkpointed_losses(engine, cfg, impl)


def sharded_load(tmp: Path) -> dict:
    """VideoMAE-format file (5-D patch weight, gamma_1/2, 8-frame learned pos-embed, 10 classes)
    into a 4-frame, 7-class model, plain and partitioned."""
    path = tmp / "videomae.pth"
    if dist.get_rank() == 0:
        torch.manual_seed(7)
        src = create_model("vit_test_tiny", pos_embed="learned", num_frames=8, layer_scale=0.1, patch_embed="conv")
        sd = {
            k.replace(".ls1.gamma", ".gamma_1").replace(".ls2.gamma", ".gamma_2"): v
            for k, v in src.state_dict().items()
        }
        torch.save({"model": sd}, path)
    dist.barrier()
    kw = {"pos_embed": "learned", "layer_scale": 0.1, "num_classes": 7}
    torch.manual_seed(0)
    plain = create_model("vit_test_tiny", **kw).eval()
    plain_report = load_weights(plain, path)
    torch.manual_seed(0)
    # only rank 0 may read: give the other ranks a path that does not exist
    source = path if dist.get_rank() == 0 else tmp / "absent.pth"
    part = build_partitioned(lambda: create_model("vit_test_tiny", **kw), config())
    report = load_weights(part, source)
    engine, *_ = deepspeed.initialize(model=part, config=config())
    engine.eval()
    with torch.no_grad():
        diff = max_diff(plain(clip()), engine(clip()))
    # a same-size safetensors file: mapped on its header, read tensor by tensor on rank 0
    st_path = tmp / "same.safetensors"
    if dist.get_rank() == 0:
        torch.manual_seed(9)
        from safetensors.torch import save_file

        save_file(create_model("vit_test_tiny", **kw).state_dict(), str(st_path))
    dist.barrier()
    plain_st = create_model("vit_test_tiny", **kw).eval()
    plain_st_report = load_weights(plain_st, st_path)
    part_st = build_partitioned(
        lambda: create_model("vit_test_tiny", **kw),
        config(),
        st_path if dist.get_rank() == 0 else tmp / "absent.safetensors",
    )
    st = {
        "param_max_diff": max_diff(dict(plain_st.named_parameters()), full_params(part_st)),
        "plain_report": plain_st_report.summary(),
        "part_report": load_weights(part_st, st_path if dist.get_rank() == 0 else "x").summary(),
    }
    return {
        "safetensors": st,
        "logits_max_diff": diff,
        "plain_report": plain_report.summary(),
        "part_report": report.summary(),
        "resized": report.resized,
        "dropped": report.dropped,
        "param_max_diff": max_diff(dict(plain.named_parameters()), full_params(part)),
    }


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    tmp = Path(sys.argv[1])
    result = {
        "default": construction({}),
        "cls_learned_heads": construction(
            {
                "pool": "cls",
                "pos_embed": "learned",
                "layer_scale": 0.1,
                "heads": {"verb": 3, "noun": 2},
                "head_init_scale": 0.5,
            }
        ),
        "bf16": bf16_table(),
        "train": {str(impl): train_losses(True, impl) for impl in (None, "torch", "deepspeed")},
        "train_plain": train_losses(False, None),
        "load": sharded_load(tmp),
    }
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()

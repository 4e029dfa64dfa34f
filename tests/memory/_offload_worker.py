"""Run under torchrun (2 ranks): ZeRO-3 parameter-offload logits vs the plain model's; writes JSON."""

import json
import os
import sys

import torch

from avion_ds.memory.offload import stream_logits, wrap_for_inference
from avion_ds.models import create_model


def main(out_dir: str) -> None:
    torch.manual_seed(0)  # same weights on every rank
    model = create_model("vit_test_tiny", num_classes=5, heads=None)
    two_heads = create_model("vit_test_tiny", heads={"verb": 3, "noun": 4})
    model.eval()
    two_heads.eval()
    x = torch.randn(3, 3, 4, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x)
        ref_heads = two_heads(x)
    total = sum(p.numel() for p in model.parameters())
    # tiny knobs force streaming: at most ~5k parameters resident, 2k prefetched
    off = wrap_for_inference(model, offload="cpu", max_live_parameters=5000, prefetch_bucket_size=2000)
    out = off(x)
    local = sum(p.ds_tensor.numel() for p in off.module.parameters())
    released = all(p.data.numel() == 0 for p in off.module.parameters())
    outs = stream_logits(two_heads, [x[:2], x[2:]], offload="cpu", max_live_parameters=5000, prefetch_bucket_size=2000)
    heads_diff = max(float((torch.cat([o[k] for o in outs]) - ref_heads[k]).abs().max()) for k in ref_heads)
    rank = int(os.environ["RANK"])
    result = {
        "rank": rank,
        "max_abs_diff": float((out - ref).abs().max()),
        "allclose": bool(torch.allclose(out, ref, atol=1e-5)),
        "local_params": int(local),
        "total_params": int(total),
        "released": bool(released),
        "heads_diff": heads_diff,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    import torch.distributed as dist

    dist.barrier()
    del off
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo threads can abort interpreter shutdown (see avion_ds/distributed/dist.py)


if __name__ == "__main__":
    main(sys.argv[1])

"""Ours vs Hugging Face transformers' VideoMAEForVideoClassification of the same size, side by side.

Both models: random init, same width/depth/heads/tubelet/patch, mean pooling, 400 classes, same
attention kernel family (``--attn sdpa``: PyTorch SDPA in both; ``flash``: flash-attn in ours,
``flash_attention_2`` in HF), same dtype, same batch. Reports train-step clips/s (forward +
backward + AdamW step, median of interleaved timed steps) and activation bytes per clip (saved
tensors, avion_ds.memory.measure_activation_bytes) with the ratios ours / HF.
Targets: speed >= 1.2x, activation memory <= 0.8x.

transformers is a bench-only extra: pip install transformers  (it must not change torch).

  python bench/peer.py --frames 8 --size 112 --batch 2 --steps 2 --act-frames 16 --act-size 224   # CPU
  python bench/peer.py --device cuda --dtype bf16 --batch 8 --steps 10 --json out/peer.json        # GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.memory.units import format_bytes
from avion_ds.models import create_model


def build_pair(name: str, frames: int, size: int, attn: str, device: str, dtype: torch.dtype):
    """(ours, hf, hf_input_fn): HF VideoMAE takes (B, T, C, H, W); ours (B, C, T, H, W)."""
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification

    ours = create_model(
        name,
        num_frames=frames,
        img_size=size,
        num_classes=400,
        drop_path_rate=0.0,
        attn_backend=attn if attn != "flash" else "flash",
    )
    a = ours.arch
    cfg = VideoMAEConfig(
        image_size=size,
        patch_size=a.patch_size,
        num_channels=3,
        num_frames=frames,
        tubelet_size=a.tubelet_size,
        hidden_size=a.embed_dim,
        num_hidden_layers=a.depth,
        num_attention_heads=a.num_heads,
        intermediate_size=a.mlp_hidden,
        qv_bias=True,
        use_mean_pooling=True,
        num_labels=400,
        layer_norm_eps=1e-6,
    )
    hf_attn = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}[attn]
    hf = (
        VideoMAEForVideoClassification(cfg, attn_implementation=hf_attn)
        if _accepts_attn()
        else VideoMAEForVideoClassification(cfg)
    )
    if not _accepts_attn():
        hf.config._attn_implementation = hf_attn
    return ours.to(device=device, dtype=dtype), hf.to(device=device, dtype=dtype)


def _accepts_attn() -> bool:
    import inspect

    from transformers import VideoMAEForVideoClassification

    return "attn_implementation" in inspect.signature(VideoMAEForVideoClassification.__init__).parameters


def hf_forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(pixel_values=x.transpose(1, 2)).logits  # (B, C, T, H, W) -> (B, T, C, H, W)


def our_forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(
    runs: dict[str, tuple[torch.nn.Module, Callable]],
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    warmup: int,
    device: str,
) -> dict[str, list[float]]:
    """Interleave ours and HF step by step so that machine noise hits both alike."""
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in runs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(warmup + steps):
        for key, (model, fwd) in runs.items():
            model.train()
            _sync(device)
            t0 = time.perf_counter()
            loss = F.cross_entropy(fwd(model, x).float(), y)
            loss.backward()
            opts[key].step()
            opts[key].zero_grad(set_to_none=True)
            _sync(device)
            if i >= warmup:
                times[key].append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--act-frames", type=int, default=None, help="clip for the activation count (default --frames)")
    p.add_argument("--act-size", type=int, default=None)
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager", "flash"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=PRECISIONS, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("bench/peer.py needs transformers (bench-only extra): pip install transformers", file=sys.stderr)
        return 2
    dtype = torch_dtype(args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32"))
    torch.manual_seed(0)
    res: dict[str, Any] = {
        "model": args.model,
        "attn": args.attn,
        "dtype": str(dtype)[6:],
        "device": args.device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.machine(),
        "command": " ".join(["python", "bench/peer.py"] + (argv or sys.argv[1:])),
    }

    # activation bytes per clip (forward only)
    af, asz = args.act_frames or args.frames, args.act_size or args.size
    ours, hf = build_pair(args.model, af, asz, args.attn, args.device, dtype)
    res["params"] = {"ours": sum(p.numel() for p in ours.parameters()), "hf": sum(p.numel() for p in hf.parameters())}
    x = torch.randn(1, 3, af, asz, asz, device=args.device, dtype=dtype)
    act_ours = measure_activation_bytes(ours, x, forward=our_forward)
    act_hf = measure_activation_bytes(hf, x, forward=hf_forward)
    res["activations"] = {"frames": af, "size": asz, "ours": act_ours, "hf": act_hf, "ratio": act_ours / act_hf}
    print(f"params: ours {res['params']['ours'] / 1e6:.2f}M, HF VideoMAE {res['params']['hf'] / 1e6:.2f}M")
    print(
        f"activation bytes/clip {af}x{asz} {str(dtype)[6:]}: ours {format_bytes(act_ours)}, HF {format_bytes(act_hf)} "
        f"-> {act_ours / act_hf:.3f}x (target <= 0.8x)"
    )
    # both with activation checkpointing of every block (ours: apply_activation_checkpointing; HF: its own
    # gradient_checkpointing_enable) - the memory/compute trade each library offers
    from avion_ds.models import apply_activation_checkpointing

    apply_activation_checkpointing(ours, every=1)
    (getattr(hf, "activation_checkpointing_enable", None) or hf.gradient_checkpointing_enable)()
    ck_ours = measure_activation_bytes(ours, x, forward=our_forward)
    ck_hf = measure_activation_bytes(hf, x, forward=hf_forward)
    res["activations_checkpointed"] = {"ours": ck_ours, "hf": ck_hf, "ratio": ck_ours / ck_hf}
    print(
        f"  with checkpointing of every block: ours {format_bytes(ck_ours)}, HF {format_bytes(ck_hf)} "
        f"-> {ck_ours / ck_hf:.3f}x; ours checkpointed vs HF plain {ck_ours / act_hf:.3f}x"
    )
    del ours, hf

    # train-step throughput
    ours, hf = build_pair(args.model, args.frames, args.size, args.attn, args.device, dtype)
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=args.device, dtype=dtype)
    y = torch.randint(0, 400, (args.batch,), device=args.device)
    times = time_steps(
        {"ours": (ours, our_forward), "hf": (hf, hf_forward)}, x, y, args.steps, args.warmup, args.device
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    clips = {k: args.batch / v for k, v in med.items()}
    res["throughput"] = {
        "frames": args.frames,
        "size": args.size,
        "batch": args.batch,
        "steps": args.steps,
        "step_s": med,
        "clips_per_s": clips,
        "speedup": clips["ours"] / clips["hf"],
        "all_step_s": times,
    }
    print(
        f"train step {args.frames}x{args.size} batch {args.batch} {str(dtype)[6:]} ({args.steps} timed steps, "
        f"median): ours {clips['ours']:.2f} clips/s, HF {clips['hf']:.2f} clips/s -> {clips['ours'] / clips['hf']:.2f}x "
        f"(target >= 1.2x)"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"peer": res}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

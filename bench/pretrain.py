"""Masked pretraining benchmarks, every comparison side by side in ONE process.

Parts (``--parts``, default all CPU ones):

* ``steps``  pretraining step vs fine-tuning step, the same ViT-B/16 encoder at 16 x 224, batch 1:
  train-step clips/s and saved-activation bytes (the encoder sees 10% of the tokens).
* ``hf``     ours vs Hugging Face ``VideoMAEForPreTraining`` (ViT-B, norm_pix_loss, tubelet 2, a
  different 0.9 tube mask per clip, fp32, SDPA both): loss after loading HF's random weights into
  ours (relative difference), train-step clips/s ratio and saved-activation bytes ratio.
* ``masks``  per-clip mask generation on the loader side (numpy, clip generator, as shipped) vs
  the device side (one batched torch draw per batch): microseconds per clip.
* ``gpu``    (``--device cuda``) ViT-B and ViT-L pretraining clips/s and peak memory in bf16,
  flash vs sdpa.

Variants alternate (round-robin, best of ``--iters``) so machine load affects them alike.

    python bench/pretrain.py                       # CPU, ~3-5 min on 2 cores
    python bench/pretrain.py --parts gpu --device cuda --batch 8
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from avion_ds.data.masking import MaskSpec
from avion_ds.memory.activations import SavedTensorTracker
from avion_ds.models import create_model, load_weights


def _tube(batch: int, grid: tuple[int, int, int], seed: int) -> torch.Tensor:
    spec = MaskSpec(grid, "tube", 0.9).validate()
    rng = np.random.default_rng(seed)
    return torch.stack([torch.from_numpy(spec.draw(rng)["mask"]) for _ in range(batch)])


def _best(fns: dict[str, callable], iters: int) -> dict[str, float]:
    """Best wall time per variant, variants interleaved."""
    for fn in fns.values():  # warm-up
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(iters):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def _saved_bytes(model: torch.nn.Module, fwd) -> int:
    model.train()
    with torch.enable_grad(), SavedTensorTracker(exclude=model) as tr:
        out = fwd()
    del out
    return tr.stats.bytes


def part_steps(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    pre = create_model("pretrain_videomae_base_patch16_224", attn_backend="sdpa")
    ft = create_model("vit_base_patch16_224", attn_backend="sdpa")
    x = torch.randn(args.batch, 3, 16, 224, 224)
    mask = _tube(args.batch, pre.encoder.patch_embed.grid, 0)

    def step_pre() -> None:
        pre(x, mask).loss.backward()
        pre.zero_grad(set_to_none=True)

    def step_ft() -> None:
        ft(x).float().square().mean().backward()
        ft.zero_grad(set_to_none=True)

    t = _best({"pretrain": step_pre, "finetune": step_ft}, args.iters)
    b_pre = _saved_bytes(pre, lambda: pre(x, mask).loss)
    b_ft = _saved_bytes(ft, lambda: ft(x))
    print(
        f"[steps] ViT-B/16 16x224 batch {args.batch} fp32 CPU sdpa, tube mask 0.9 "
        f"({int((~mask[0]).sum())} of {mask.shape[1]} tokens visible)"
    )
    for k, sec, nbytes in (("pretrain", t["pretrain"], b_pre), ("finetune", t["finetune"], b_ft)):
        print(
            f"  {k:9s} {args.batch / sec:7.3f} clips/s  step {sec:6.2f} s  saved activations {nbytes / 2**20:8.1f} MiB"
        )
    print(
        f"  pretrain / finetune: speed x{t['finetune'] / t['pretrain']:.2f}, activation bytes x{b_pre / b_ft:.3f} "
        f"(finetune needs x{b_ft / b_pre:.1f} more)"
    )


def part_hf(args: argparse.Namespace) -> None:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.VideoMAEConfig(
        norm_pix_loss=True, use_mean_pooling=False, layer_norm_eps=1e-6, attn_implementation="sdpa"
    )
    hf = transformers.VideoMAEForPreTraining(cfg)
    ours = create_model("pretrain_videomae_base_patch16_224", attn_backend="sdpa", decoder_norm_eps=1e-5)
    report = load_weights(ours, hf.state_dict(), strict=True)
    x = torch.randn(args.batch, 3, 16, 224, 224)
    xt = x.transpose(1, 2).contiguous()
    mask = _tube(args.batch, ours.encoder.patch_embed.grid, 1)
    assert args.batch == 1 or len({tuple(m.tolist()) for m in mask}) == args.batch
    hf.eval()
    ours.eval()
    with torch.no_grad():
        l_hf = float(hf(xt, bool_masked_pos=mask).loss)
        l_ours = float(ours(x, mask).loss)
    hf.train()
    ours.train()

    def step_ours() -> None:
        ours(x, mask).loss.backward()
        ours.zero_grad(set_to_none=True)

    def step_hf() -> None:
        hf(xt, bool_masked_pos=mask).loss.backward()
        hf.zero_grad(set_to_none=True)

    t = _best({"ours": step_ours, "hf": step_hf}, args.iters)
    b_ours = _saved_bytes(ours, lambda: ours(x, mask).loss)
    b_hf = _saved_bytes(hf, lambda: hf(xt, bool_masked_pos=mask).loss)
    print(
        f"[hf] ViT-B pretraining vs transformers {transformers.__version__} VideoMAEForPreTraining, batch "
        f"{args.batch}, a different 0.9 tube mask per clip, fp32, sdpa both; weights: {report.summary()}"
    )
    print(f"  loss ours {l_ours:.7f}  hf {l_hf:.7f}  relative difference {abs(l_ours - l_hf) / abs(l_hf):.2e}")
    for k, sec, nbytes in (("ours", t["ours"], b_ours), ("hf", t["hf"], b_hf)):
        print(
            f"  {k:5s} {args.batch / sec:7.3f} clips/s  step {sec:6.2f} s  saved activations {nbytes / 2**20:8.1f} MiB"
        )
    print(
        f"  ours / hf: speed x{t['hf'] / t['ours']:.2f} (target >= 1.0), activation bytes x{b_ours / b_hf:.3f} "
        "(target <= 0.8)"
    )


def part_masks(args: argparse.Namespace) -> None:
    from avion_ds.data.crop import clip_rng

    grid, batch, reps = (8, 14, 14), 32, 50
    spec = MaskSpec(grid, "tube", 0.9, "running_cell", 0.5).validate()

    def loader_side() -> None:  # what VideosDataset does per clip, here for a batch's worth of clips
        for i in range(batch):
            spec.draw(clip_rng(0, 0, i, 7919))

    gen = torch.Generator().manual_seed(0)
    n_tok, per = grid[1] * grid[2], int(0.9 * grid[1] * grid[2])

    def device_side() -> None:  # batched: tube = argsort of uniform noise per clip, tiled over time
        noise = torch.rand(batch, n_tok, generator=gen)
        keep = noise.argsort(dim=1)[:, : n_tok - per]
        m = torch.ones(batch, n_tok, dtype=torch.bool)
        m.scatter_(1, keep, False)
        m.repeat(1, grid[0])

    t = _best(
        {
            "loader": lambda: [loader_side() for _ in range(reps)],
            "device": lambda: [device_side() for _ in range(reps)],
        },
        args.iters,
    )
    us = {k: v / (reps * batch) * 1e6 for k, v in t.items()}
    print(
        f"[masks] (8, 14, 14) tube 0.9 + running cell 0.5, per clip: loader side (numpy, clip generator) "
        f"{us['loader']:.1f} us, device side (batched torch on CPU) {us['device']:.1f} us"
    )


def part_gpu(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        print("[gpu] no CUDA device: skipped")
        return
    dev = torch.device("cuda")
    for name in ("pretrain_videomae_base_patch16_224", "pretrain_videomae_large_patch16_224"):
        for backend in ("flash", "sdpa"):
            try:
                m = create_model(name, attn_backend=backend).to(dev)
            except RuntimeError as e:
                print(f"[gpu] {name} {backend}: {e}")
                continue
            x = torch.randn(args.batch, 3, 16, 224, 224, device=dev)
            mask = _tube(args.batch, m.encoder.patch_embed.grid, 0).to(dev)

            def step(m: torch.nn.Module = m, x: torch.Tensor = x, mask: torch.Tensor = mask) -> None:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = m(x, mask).loss
                loss.backward()
                m.zero_grad(set_to_none=True)
                torch.cuda.synchronize()

            step()
            torch.cuda.reset_peak_memory_stats()
            sec = _best({"s": step}, args.iters)["s"]
            print(
                f"[gpu] {name} {backend} bf16 batch {args.batch}: {args.batch / sec:.1f} clips/s, "
                f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
            )
            del m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", default=["steps", "hf", "masks"], choices=("steps", "hf", "masks", "gpu"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for part in args.parts:
        globals()[f"part_{part}"](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

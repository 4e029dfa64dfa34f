"""Does masked pretraining learn, and does it help fine-tuning? On `avion-ds synth` data.

1. Synthetic EPIC-style videos (``make_synthetic_epic``, ``--background smooth`` by default: linear
   colour ramps per segment, spatially predictable) chunked as usual; the pretraining clips come
   from the ``videos`` dataset (stride sampling, multi-scale crop) over all but one video, the
   validation clips from the held-out video (evenly spaced, centre crop, fixed masks).
2. Pretrain a tiny VideoMAE (``pretrain_videomae_test_tiny`` with the overrides below) for ``--steps``;
   report the validation reconstruction loss next to the predict-zero baseline.
3. Fine-tune ``vit_test_tiny`` (same encoder overrides, verb + noun heads) on 10% of the training
   rows, from the pretrained encoder and from scratch, with the same budget; report val top-1.

Both phases use one-process loops over cached clips (``fit_clips`` below and the
plain loop below) so the whole bench takes a few minutes on 2 CPU cores.

    python bench/pretrain_learn.py --out /tmp/learn
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from avion_ds.config import DataConfig
from avion_ds.data import DeviceAugment, build_dataset
from avion_ds.data.datasets.videos import VideosKeys
from avion_ds.data.masking import MaskSpec
from avion_ds.engine.optim import param_groups
from avion_ds.models import create_model
from avion_ds.models.mae.model import pixel_targets
from avion_ds.tasks.finetune.losses import total_loss

ENCODER = {"num_frames": 8, "img_size": 32, "patch_size": 16, "embed_dim": 128}


def adamw_steps(
    model: torch.nn.Module,
    loss_of: Callable[[torch.Generator], torch.Tensor],
    lr: float,
    seed: int = 0,
    weight_decay: float = 0.05,
    betas: tuple[float, float] = (0.9, 0.95),
) -> Iterator[float]:
    """A plain one-process AdamW loop at a constant lr, one step per ``next``: ``loss_of(generator)`` draws
    its batch and returns its loss; yields the step's loss. For quick learning checks (tests,
    bench/pretrain_learn.py, bench/umt_learn.py); real runs go through ``avion-ds train``."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas)
    while True:
        model.train()
        loss = loss_of(gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        yield float(loss.detach())


def adamw_loop(
    model: torch.nn.Module,
    loss_of: Callable[[torch.Generator], torch.Tensor],
    steps: int,
    lr: float,
    seed: int = 0,
    weight_decay: float = 0.05,
    betas: tuple[float, float] = (0.9, 0.95),
) -> list[float]:
    """``steps`` steps of :func:`adamw_steps`; the loss of every step."""
    return list(itertools.islice(adamw_steps(model, loss_of, lr, seed, weight_decay, betas), steps))


def masked_loss(
    model: torch.nn.Module, clips: torch.Tensor, spec: MaskSpec, batch_size: int, seed: int = 0
) -> Callable[[torch.Generator], torch.Tensor]:
    """The masked-pretraining loss of a batch of cached, normalised clips (B, C, T, H, W), fresh masks every
    call (numpy generator seeded by ``seed``): ``loss_of`` for :func:`adamw_steps`."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def loss_of(gen: torch.Generator) -> torch.Tensor:
        idx = torch.randint(len(clips), (batch_size,), generator=gen)
        drawn = [spec.draw(rng) for _ in range(batch_size)]
        masks = {k: torch.from_numpy(np.stack([d[k] for d in drawn])) for k in drawn[0]}
        return model(clips[idx], **masks).loss

    return loss_of


def fit_clips(
    model: torch.nn.Module,
    clips: torch.Tensor,
    spec: MaskSpec,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    weight_decay: float = 0.05,
) -> list[float]:
    """Masked pretraining of ``model`` on cached clips for ``steps`` AdamW steps (betas 0.9/0.95, fresh masks
    every step). Returns the loss of every step."""
    return adamw_loop(model, masked_loss(model, clips, spec, batch_size, seed), steps, lr, seed, weight_decay)


def make_data(out: Path, seed: int, background: str, width: int = 64, height: int = 48) -> dict:
    """6 synthetic EPIC-style videos of 20 one-second segments (``width`` x ``height``, 12 fps), chunked."""
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic

    info = make_synthetic_epic(
        out / "synth",
        num_videos=6,
        segments_per_video=20,
        segment_seconds=1.0,
        width=width,
        height=height,
        fps=12,
        val_fraction=0.25,
        seed=seed,
        background=background,
    )
    chunk_videos(info["videos"], out / "chunks", chunk_seconds=6.0, short_side=height, fps=12, gop=12, progress=False)
    return info


def cache(ds, augment) -> tuple[torch.Tensor, object]:
    items = [ds[i] for i in range(len(ds))]
    x, _ = augment(torch.stack([it["frames"] for it in items]), {})
    labels = [it["label"] for it in items]
    return x, labels


def recon_vs_zero(model, x: torch.Tensor, masks: dict) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        loss = float(model(x, **masks).loss)
        zero = float(pixel_targets(x, model.arch)[masks["mask"]].pow(2).mean())
    return loss, zero


def unlabelled_clips(args: argparse.Namespace, root: Path, spec: MaskSpec, encoder: dict = ENCODER) -> dict:
    """The pretraining clips, cached and normalised: ``train`` from all videos but the last (stride
    sampling, multi-scale crop), ``val`` from the held-out last video with its fixed masks ``val_masks``
    drawn by ``spec``; ``videos``: how many train videos."""
    videos = sorted(p.name for p in (root / "chunks").iterdir() if p.is_dir())
    (root / "pt_train.txt").write_text("\n".join(videos[:-1]) + "\n")
    (root / "pt_val.txt").write_text(videos[-1] + "\n")
    cfg = DataConfig(
        dataset="videos",
        root=str(root / "chunks"),
        train_csv=str(root / "pt_train.txt"),
        val_csv=str(root / "pt_val.txt"),
        num_frames=encoder["num_frames"],
        sampling="stride",
        stride=1,
        size=encoder["img_size"],
        decoder="decord",
        workers=0,
        decode_timeout_s=args.decode_timeout_s,
        hflip=0.0,
    )
    aug = DeviceAugment(cfg, 0, train=False)
    own = {"videos": VideosKeys(clips_per_video=args.clips_per_video)}  # the videos dataset's own section
    train = build_dataset(cfg, "train", seed=args.seed, sections=own)
    val = build_dataset(cfg, "val", seed=args.seed, sections=own)
    train.masks = val.masks = spec
    xt, _ = cache(train, aug)
    xv, vlabels = cache(val, aug)
    vmasks = {k: torch.stack([lab[k] for lab in vlabels]) for k in vlabels[0]}
    return {"train": xt, "val": xv, "val_masks": vmasks, "videos": len(videos) - 1}


def pretrain(args: argparse.Namespace, root: Path) -> tuple[torch.nn.Module, dict]:
    """A tiny VideoMAE pretrained for ``args.steps`` steps; returns it and {recon, zero}."""
    model = create_model("pretrain_videomae_test_tiny", decoder_dim=64, **ENCODER)
    spec = MaskSpec(model.arch.encoder.grid, args.mask_type, args.mask_ratio).validate()
    clips = unlabelled_clips(args, root, spec)
    xt, xv, vmasks = clips["train"], clips["val"], clips["val_masks"]
    before = recon_vs_zero(model, xv, vmasks)
    losses = fit_clips(model, xt, spec, args.steps, args.lr, args.batch, seed=args.seed)
    after = recon_vs_zero(model, xv, vmasks)
    print(
        f"[pretrain] {args.background} background; {len(xt)} train clips ({clips['videos']} videos), "
        f"{len(xv)} val clips (held-out video); "
        f"mask {args.mask_type} {args.mask_ratio}, {args.steps} steps batch {args.batch} lr {args.lr}"
    )
    print(
        f"  val recon loss {before[0]:.4f} -> {after[0]:.4f}; predict-zero baseline {after[1]:.4f}; "
        f"ratio {after[0] / after[1]:.3f} (last train loss {sum(losses[-20:]) / 20:.4f})"
    )
    return model, {"recon": after[0], "zero": after[1]}


def encoder_weights(mae: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A pretrained VideoMAE's encoder in our pretraining layout (what ``model.pretrained`` loads)."""
    encoder = {f"encoder.{k}": v for k, v in mae.encoder.state_dict().items()}
    encoder["encoder_to_decoder.weight"] = mae.encoder_to_decoder.weight.detach()  # marks our pretraining layout
    return encoder


def finetune(
    args: argparse.Namespace, root: Path, info: dict, encoder_sd: dict | None, encoder: dict = ENCODER
) -> dict[str, float]:
    """``vit_test_tiny`` with ``encoder`` (verb + noun heads) from ``encoder_sd`` (None: scratch), trained on 10%
    of the training rows (``args.ft_views`` crops each) and scored on the val rows: top-1 per head."""
    with open(info["train_csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    random.Random(args.seed).shuffle(rows)
    few = rows[: max(1, len(rows) // 10)]
    sub = root / "train_10pct.csv"
    with sub.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(few)
    cfg = DataConfig(
        dataset="epic",
        root=str(root / "chunks"),
        train_csv=str(sub),
        val_csv=str(info["val_csv"]),
        num_frames=encoder["num_frames"],
        size=encoder["img_size"],
        decoder="decord",
        workers=0,
        decode_timeout_s=args.decode_timeout_s,
        hflip=0.0,
        label_smoothing=0.1,
        crop_scale=[0.7, 1.0],
    )
    heads = {"verb": info["num_verbs"], "noun": info["num_nouns"]}
    torch.manual_seed(args.seed)
    model = create_model("vit_test_tiny", heads=heads, pretrained=encoder_sd, **encoder)
    aug = DeviceAugment(cfg, heads, train=False)
    train, val = build_dataset(cfg, "train", seed=args.seed), build_dataset(cfg, "val", seed=args.seed)
    views = []
    for epoch in range(args.ft_views):  # a few random crops / jitters of each labelled clip
        train.set_epoch(epoch)
        views.append(cache(train, aug))
    xt = torch.cat([v[0] for v in views])
    yt = {h: torch.tensor([lab[h] for v in views for lab in v[1]]) for h in heads}
    xv, vl = cache(val, aug)
    yv = {h: torch.tensor([lab[h] for lab in vl]) for h in heads}
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=args.ft_lr)
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    for _ in range(args.ft_steps):
        idx = torch.randint(len(xt), (args.batch,), generator=gen)
        loss, _ = total_loss(model(xt[idx]), {h: y[idx] for h, y in yt.items()}, 0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        out = model(xv)
    acc = {h: float((out[h].argmax(-1) == yv[h]).float().mean() * 100) for h in heads}
    acc["labelled_rows"] = len(few)
    acc["val_rows"] = len(xv)
    return acc


def learn_parser(description: str, out: str) -> argparse.ArgumentParser:
    """The options of the learning benches (pretraining, 10%-label fine-tuning), shared with bench/umt_learn.py."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=out)
    p.add_argument("--steps", type=int, default=1500, help="pretraining steps (at most)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--mask-type", default="tube")
    p.add_argument("--mask-ratio", type=float, default=0.9)
    p.add_argument("--clips-per-video", type=int, default=64)
    p.add_argument("--background", default="smooth", help="synthetic background: smooth | blocks")
    p.add_argument("--ft-steps", type=int, default=300)
    p.add_argument("--ft-lr", type=float, default=1e-3)
    p.add_argument("--ft-views", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--decode-timeout-s",
        type=float,
        default=DataConfig.decode_timeout_s,
        help="data.decode_timeout_s (0: decode in-process, no helper process to start: the tiny smoke run)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = learn_parser(__doc__.splitlines()[0], "/tmp/avion_pretrain_learn")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    root = Path(args.out)
    info = make_data(root, args.seed, args.background)
    mae, _ = pretrain(args, root)
    encoder = encoder_weights(mae)
    scratch = finetune(args, root, info, None)
    pre = finetune(args, root, info, encoder)
    print(
        f"[finetune] 10% of the training rows ({pre['labelled_rows']} clips x {args.ft_views} crops), "
        f"{args.ft_steps} steps batch {args.batch} lr {args.ft_lr}, val {pre['val_rows']} clips:"
    )
    for name, acc in (("scratch init", scratch), ("pretrained init", pre)):
        print(f"  {name:16s} verb top-1 {acc['verb']:5.1f}  noun top-1 {acc['noun']:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

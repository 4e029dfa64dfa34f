"""`avion-ds reconstruct --checkpoint RUN --video FILE --out grid.png`: look at a pretraining run.

One PNG, three rows (original / masked input / reconstruction) over a few frames of one clip
taken from the middle of ``FILE`` the way validation takes it (stride sampling, centre crop). The
masks come from the run's recipe (tube / random, plus the V2 decoder mask), drawn with ``--seed``.
Reconstructed tokens are the decoder's predictions; with ``norm_pix_loss`` they are un-normalised
with the original patch's own mean / std (as VideoMAE's visualisation does). Tokens the decoder
did not predict (visible ones, or those V2's decoder mask left out) show the original pixels in
the reconstruction row; hidden tokens are grey in the masked row.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch

from avion_ds.cli.args import Parser
from avion_ds.config import ConfigError, Recipe, add_override_option
from avion_ds.distributed import dist
from avion_ds.tasks.pretrain import PretrainTask, build_pretrain_model, mask_spec


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="avion-ds reconstruct", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="pretraining run directory, or a weights file (needs --config)")
    p.add_argument("--video", required=True, help="a video file")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--config", default=None, help="recipe (default: RUN/recipe.yaml)")
    add_override_option(p)
    p.add_argument("--frames", type=int, default=4, help="frames (columns) to show")
    p.add_argument("--seed", type=int, default=0, help="seed of the masks")
    p.add_argument("--min-side", type=int, default=128, help="upscale (nearest) small frames to at least this")
    return p.parse_args(argv)


def _recipe(args: argparse.Namespace) -> Recipe:
    ckpt = Path(args.checkpoint)
    if not ckpt.exists():
        raise ConfigError(f"--checkpoint not found: {ckpt}")
    if not Path(args.video).is_file():
        raise ConfigError(f"--video not found: {args.video}")
    config = args.config or (ckpt / "recipe.yaml" if ckpt.is_dir() else None)
    if config is None or not Path(config).is_file():
        raise ConfigError("--config is required when --checkpoint is not a run directory with recipe.yaml")
    from avion_ds.tasks import load_recipe

    recipe = load_recipe(config, args.overrides)
    if recipe.task != PretrainTask.name:
        raise ConfigError(f"{config}: task={recipe.task!r}; reconstruct needs a pretraining run (task: pretrain)")
    if args.frames <= 0:
        raise ConfigError(f"--frames={args.frames} must be positive")
    return recipe


def load_clip(recipe: Recipe, video: str) -> torch.Tensor:
    """uint8 (T, H, W, C): the centre clip of ``video`` as validation samples it."""
    from avion_ds.data.crop import CropSpec, center_crop
    from avion_ds.data.decode.select import get_decoder
    from avion_ds.data.prep.manifest import probe_video
    from avion_ds.data.sampling import map_to_chunks, stride_indices

    d = recipe.data
    entry = probe_video(video)
    idx = stride_indices(0, entry.num_frames, d.num_frames, d.stride, train=False)
    spec = CropSpec(center_crop(entry.height, entry.width), (d.size, d.size), entry.height, entry.width)
    decoder = get_decoder(d.decoder, d.decoder_threads, d.decode_timeout_s)
    return torch.cat([decoder.decode(path, local, spec) for path, local in map_to_chunks(idx, entry)])


def unpatchify(patches: torch.Tensor, grid: tuple[int, int, int], tubelet: int, patch: int) -> torch.Tensor:
    """(N, t*p*p*C) tokens in VideoMAE target order -> (T, H, W, C); inverse of ``pixel_targets``."""
    gt, gh, gw = grid
    x = patches.reshape(gt, gh, gw, tubelet, patch, patch, -1)
    return x.permute(0, 3, 1, 4, 2, 5, 6).reshape(gt * tubelet, gh * patch, gw * patch, -1)


@torch.no_grad()
def reconstruct_grid(
    model: torch.nn.Module, x: torch.Tensor, masks: dict[str, torch.Tensor], frames: int
) -> np.ndarray:
    """uint8 (3*H, F*W, 3) image: original / masked / reconstruction rows for ``frames`` frames."""
    from avion_ds.models.mae import pixel_targets

    arch = model.arch
    e = arch.encoder
    pred, decode = model.predict(x, masks["mask"], masks.get("decode_mask"))
    raw = pixel_targets(x, dataclasses.replace(arch, norm_pix_loss=False))[0]  # (N, P) in [0, 1]
    recon = raw.clone()
    out = pred[0].float()
    if arch.norm_pix_loss:
        tokens = raw[decode[0]].reshape(-1, e.tubelet_size * e.patch_size**2, e.in_chans)
        mean, std = tokens.mean(1, keepdim=True), tokens.var(1, unbiased=True, keepdim=True).sqrt() + 1e-6
        out = (out.reshape(tokens.shape) * std + mean).reshape(out.shape)
    recon[decode[0]] = out
    masked = raw.clone()
    masked[masks["mask"][0]] = 0.5
    rows = [unpatchify(t, e.grid, e.tubelet_size, e.patch_size) for t in (raw, masked, recon)]
    pick = np.linspace(0, rows[0].shape[0] - 1, min(frames, rows[0].shape[0])).round().astype(int)
    img = torch.cat([torch.cat([r[i] for i in pick], dim=1) for r in rows], dim=0)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def run(args: argparse.Namespace) -> int:
    recipe = _recipe(args)
    from PIL import Image

    from avion_ds.data.augment import DeviceAugment
    from avion_ds.models import load_pretrained_mae

    model = build_pretrain_model(recipe, pretrained="")
    report = load_pretrained_mae(model, args.checkpoint, strict=True)
    print(f"loaded {args.checkpoint}: {report.summary()}", flush=True)
    model.eval()
    clip = load_clip(recipe, args.video)
    x, _ = DeviceAugment(recipe.data, 0, train=False)(clip[None], {})
    drawn = mask_spec(recipe).draw(np.random.default_rng(args.seed))
    masks = {k: torch.from_numpy(v)[None] for k, v in drawn.items()}
    with torch.no_grad():
        loss = float(model(x, **masks).loss)
    img = reconstruct_grid(model, x, masks, args.frames)
    scale = max(1, -(-args.min_side // recipe.data.size))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pil = Image.fromarray(img)
    if scale > 1:
        pil = pil.resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST)
    pil.save(out)
    print(
        f"wrote {out}: rows original / masked ({recipe.pretrain.mask_type} {recipe.pretrain.mask_ratio}) / "
        f"reconstruction, {len(drawn)} mask(s), clip loss {loss:.4f}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds reconstruct`."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds reconstruct", lambda: run(args), {ConfigError: 2})


if __name__ == "__main__":
    sys.exit(main())

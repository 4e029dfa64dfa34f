"""`avion-ds reconstruct --checkpoint RUN --video FILE --out grid.png`: look at a pretraining run.

One PNG, three rows (original / masked input / reconstruction, named on a left margin) over a few frames
of one clip taken from the middle of ``FILE`` the way validation takes it (stride sampling, centre crop). The
masks come from the run's recipe (tube / random, plus the V2 decoder mask), drawn with ``--seed``.
Reconstructed tokens are the decoder's predictions; with ``norm_pix_loss`` they are un-normalised
with the original patch's own mean / std (as VideoMAE's visualisation does). Tokens the decoder
did not predict (visible ones, or those V2's decoder mask left out) show the original pixels in
the reconstruction row; hidden tokens are grey in the masked row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from avion_ds.config import Recipe
from avion_ds.data.crop import CropSpec, center_crop
from avion_ds.data.decode.select import get_decoder
from avion_ds.data.prep.manifest import probe_video
from avion_ds.data.sampling import map_to_chunks, stride_indices
from avion_ds.tasks.common.pictures import label_rows


def load_clip(recipe: Recipe, video: str) -> torch.Tensor:
    """uint8 (T, H, W, C): the centre clip of ``video`` as validation samples it."""

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


ROWS = ("original", "masked", "reconstruction")  # the grid's rows, top to bottom, as the picture names them


@torch.no_grad()
def reconstruct_grid(
    model: torch.nn.Module, x: torch.Tensor, masks: dict[str, torch.Tensor], frames: int
) -> np.ndarray:
    """uint8 (3*H, F*W, 3) image: original / masked / reconstruction rows for ``frames`` frames."""
    pred, decode = model.predict(x, masks["mask"], masks.get("decode_mask"))
    return prediction_grid(model.arch, x, masks["mask"], pred, decode, frames)


@torch.no_grad()
def prediction_grid(
    arch: Any, x: torch.Tensor, mask: torch.Tensor, pred: torch.Tensor, decode: torch.Tensor, frames: int
) -> np.ndarray:
    """The grid of :func:`reconstruct_grid` for the first clip of ``x`` from the decoder's predictions
    ``pred`` (B, N_dec, P) at the ``decode`` positions (what the model's forward returns as ``pred``)."""
    from avion_ds.models.mae.model import pixel_targets  # lazy: heavy (timm, torchvision)

    e = arch.encoder
    raw = pixel_targets(x[:1].float(), dataclasses.replace(arch, norm_pix_loss=False))[0]  # (N, P) in [0, 1]
    recon = raw.clone()
    out = pred[0].float()
    if arch.norm_pix_loss:
        tokens = raw[decode[0]].reshape(-1, e.tubelet_size * e.patch_size**2, e.in_chans)
        mean, std = tokens.mean(1, keepdim=True), tokens.var(1, unbiased=True, keepdim=True).sqrt() + 1e-6
        out = (out.reshape(tokens.shape) * std + mean).reshape(out.shape)
    recon[decode[0]] = out
    masked = raw.clone()
    masked[mask[0]] = 0.5
    rows = [unpatchify(t, e.grid, e.tubelet_size, e.patch_size) for t in (raw, masked, recon)]
    pick = np.linspace(0, rows[0].shape[0] - 1, min(frames, rows[0].shape[0])).round().astype(int)
    img = torch.cat([torch.cat([r[i] for i in pick], dim=1) for r in rows], dim=0)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


def named_rows(img: np.ndarray) -> np.ndarray:
    """The grid with its rows named on a left margin (original / masked / reconstruction)."""
    return label_rows(img, ROWS)

"""VideoMAE / VideoMAE V2 masked-autoencoder pretraining model on our ViT blocks.

The encoder is a ``VideoViT`` (same blocks, attention switch, linear tubelet embedding, sin-cos
positions) run on the VISIBLE tokens only; its final token norm is the ``fc_norm`` LayerNorm, so
``encoder.*`` minus the prefix is a fine-tuning state dict. The light decoder (``encoder_to_decoder``
projection, learnable ``mask_token``, fixed sin-cos positions over the full grid, a few blocks, norm,
linear head to ``tubelet * patch * patch * 3`` pixels) follows VideoMAE V2's ``modeling_pretrain``.

``model(frames, mask, decode_mask=None)``: frames (B, C, T, H, W) normalised as for fine-tuning; mask
bool (B, N), True = hidden from the encoder, the same count per clip; ``decode_mask`` (V2 dual
masking) bool (B, N), True = NOT reconstructed: the decoder gets mask tokens at ``~decode_mask`` and
the loss averages over those positions that the encoder did not see (V2's ``cal_loss_mask``). Without
``decode_mask`` the decoder reconstructs exactly the encoder-masked tokens (VideoMAE v1 / HF).
Returns :class:`MAEOutput` with the scalar ``loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from timm.layers import trunc_normal_
from torch import nn

from avion_ds.models.arch import ViTArch
from avion_ds.models.mae.weights import prepare_mae_state_dict
from avion_ds.models.partition import full_ndim
from avion_ds.models.vit.model import Block, VideoViT, sincos_table
from avion_ds.models.weights.report import LoadReport

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class MAEArch:
    """Encoder ``ViTArch`` plus the decoder and target settings of a pretraining model."""

    encoder: ViTArch
    decoder_dim: int = 384
    decoder_depth: int = 4
    decoder_heads: int = 6
    decoder_norm_eps: float = 1e-6  # official 1e-6; Hugging Face's decoder norm uses 1e-5
    norm_pix_loss: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN  # to un-normalise frames for the targets
    std: tuple[float, float, float] = IMAGENET_STD

    @property
    def video_transformer(self) -> ViTArch:
        """The video transformer this architecture runs on the clips: the encoder."""
        return self.encoder

    @property
    def decoder_arch(self) -> ViTArch:
        e = self.encoder
        return ViTArch(
            name=f"{e.name}.decoder",
            embed_dim=self.decoder_dim,
            depth=self.decoder_depth,
            num_heads=self.decoder_heads,
            mlp_ratio=e.mlp_ratio,
            qkv_bias=e.qkv_bias,
            attn_backend=e.attn_backend,
            norm_eps=e.norm_eps,
            num_classes=0,
        ).validate()

    @property
    def pixels_per_token(self) -> int:
        e = self.encoder
        return e.tubelet_size * e.patch_size * e.patch_size * e.in_chans


class MAEOutput(NamedTuple):
    """What the pretraining model returns: the loss, the decoder's predictions (B, Nd, P) and the
    float32 pixel targets (B, Nd, P) at the same positions.

    A NamedTuple, so that ZeRO-3's backward hooks reach its tensors (they skip dataclasses and
    would leave the top module's own parameters, e.g. ``mask_token``, partitioned in backward)."""

    loss: torch.Tensor
    pred: torch.Tensor
    target: torch.Tensor


class MAEDecoder(nn.Module):
    """Decoder blocks -> LayerNorm -> linear pixel head, applied to the last ``num_pred`` tokens."""

    def __init__(self, arch: MAEArch) -> None:
        super().__init__()
        darch = arch.decoder_arch
        self.blocks = nn.ModuleList([Block(darch, 0.0) for _ in range(darch.depth)])
        self.norm = nn.LayerNorm(darch.embed_dim, eps=arch.decoder_norm_eps)
        self.head = nn.Linear(darch.embed_dim, arch.pixels_per_token)

    def forward(self, x: torch.Tensor, num_pred: int) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, -num_pred:]))


def pixel_targets(frames: torch.Tensor, arch: MAEArch) -> torch.Tensor:
    """Reconstruction targets (B, N, t*p*p*C) from normalised frames (B, C, T, H, W), in float32.

    Un-normalise with the data statistics, cut tubelets (values ordered tubelet, row, column,
    channel), and with ``norm_pix_loss`` normalise every token and channel over its t*p*p values
    by the mean and unbiased std (+1e-6), exactly as VideoMAE does.
    """
    e = arch.encoder
    x = frames.float()
    mean = x.new_tensor(arch.mean).view(1, -1, 1, 1, 1)
    std = x.new_tensor(arch.std).view(1, -1, 1, 1, 1)
    x = x * std + mean
    B, C, T, H, W = x.shape
    t, p = e.tubelet_size, e.patch_size
    x = x.reshape(B, C, T // t, t, H // p, p, W // p, p).permute(0, 2, 4, 6, 3, 5, 7, 1)
    x = x.reshape(B, (T // t) * (H // p) * (W // p), t * p * p, C)
    if arch.norm_pix_loss:
        x = (x - x.mean(dim=-2, keepdim=True)) / (x.var(dim=-2, unbiased=True, keepdim=True).sqrt() + 1e-6)
    return x.reshape(B, x.shape[1], t * p * p * C)


def check_masks(mask: torch.Tensor, decode_mask: torch.Tensor | None, batch: int, num_tokens: int) -> None:
    """One-line ValueError unless the masks are bool (B, N) with equal counts per clip."""
    for name, m in (("mask", mask), ("decode_mask", decode_mask)):
        if m is None:
            continue
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or tuple(m.shape) != (batch, num_tokens):
            got = f"{m.dtype} {tuple(m.shape)}" if isinstance(m, torch.Tensor) else type(m).__name__
            raise ValueError(f"{name}: expected a bool tensor of shape ({batch}, {num_tokens}), got {got}")
        counts = m.sum(dim=1)
        if batch and bool((counts != counts[0]).any()):
            raise ValueError(f"{name}: every clip must mask the same number of tokens, got {counts.tolist()}")
    if bool((~mask).sum(dim=1).eq(0).any()):
        raise ValueError("mask: hides every token of a clip; the encoder needs at least one visible token")


class VideoMAEPretrain(nn.Module):
    """Masked-autoencoder pretraining model (see module docstring)."""

    def __init__(self, arch: MAEArch) -> None:
        super().__init__()
        self.arch = arch
        self.encoder = VideoViT(arch.encoder)
        self.depth = arch.encoder.depth
        self.num_frames, self.img_size = arch.encoder.num_frames, arch.encoder.img_size
        self.encoder_to_decoder = nn.Linear(arch.encoder.embed_dim, arch.decoder_dim, bias=False)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, arch.decoder_dim))
        self.register_buffer(
            "decoder_pos", sincos_table(self.encoder.patch_embed.num_patches, arch.decoder_dim), persistent=False
        )
        self.decoder = MAEDecoder(arch)
        self._init_weights()

    def _init_weights(self) -> None:
        """VideoMAE pretraining init (modeling_pretrain of VideoMAE and V2): the encoder's and the
        decoder's own ``apply`` give xavier-uniform linears, zero biases and unit norms; the patch
        embedding and ``encoder_to_decoder`` (the top module never calls ``apply``) keep PyTorch's
        default; ``mask_token`` (and a learned position table) is normal(0, 0.02) truncated at
        +-0.02, one std. Under ZeRO-3 partitioned construction the parameters are gathered for it
        (rank 0 initialises, then re-partitions)."""
        params = list(self.parameters())
        if any(hasattr(p, "ds_id") for p in params):
            import deepspeed  # lazy: heavy, and only a ZeRO-3 partitioned construction needs it

            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                self._init_full()
        else:
            self._init_full()

    def _init_full(self) -> None:
        for name, m in self.named_modules():
            if name.startswith(("encoder.patch_embed", "encoder_to_decoder")):
                continue
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        std = 0.02
        trunc_normal_(self.mask_token, std=std, a=-std, b=std)
        if isinstance(self.encoder.pos_embed, nn.Parameter):
            trunc_normal_(self.encoder.pos_embed, std=std, a=-std, b=std)

    def prepare_checkpoint(
        self, source: str | Path | dict[str, Any], trust: bool = False, *, kinetics_head: bool = False
    ) -> tuple[dict[str, torch.Tensor], LoadReport]:
        """``source`` mapped to this model's names and a ``LoadReport``, from the pretraining layouts;
        ``load_weights`` takes this model's weights through it (``kinetics_head``
        is a classifier's option: a pretraining model has none, so it is not used)."""
        return prepare_mae_state_dict(self, source, trust)

    # -- blocks / optimizer hooks used by activation checkpointing and param groups -------------
    @property
    def blocks(self) -> nn.ModuleList:
        """Encoder blocks then decoder blocks (what activation checkpointing wraps)."""
        return nn.ModuleList([*self.encoder.blocks, *self.decoder.blocks])

    @property
    def num_tokens(self) -> int:
        return self.encoder.patch_embed.num_patches

    def no_weight_decay(self) -> set[str]:
        """Encoder's (positions, norms, biases), the mask token, and every 1-D decoder parameter
        (by the logical shape: a ZeRO-3 partition's data is empty, 1-D, whatever the parameter)."""
        out = {f"encoder.{n}" for n in self.encoder.no_weight_decay()} | {"mask_token"}
        return out | {n for n, p in self.named_parameters() if full_ndim(p) <= 1}

    def layer_id(self, param_name: str) -> int:
        name = param_name.removeprefix("module.")
        if name.startswith("encoder."):
            return self.encoder.layer_id(name.removeprefix("encoder."))
        return self.depth + 1

    # -- forward ---------------------------------------------------------------------------------
    def encode(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Normed encoder tokens of the visible positions (B, N_vis, D); only those are embedded."""
        enc = self.encoder
        B = frames.shape[0]
        pos = enc.pos_embed.to(frames.dtype).expand(B, -1, -1)[~mask].reshape(B, -1, enc.embed_dim)
        if enc.patch_embed.mode == "linear":  # embed only the visible tubelets (no full-clip activation)
            tubelets = enc.patch_embed.patchify(frames)
            x = enc.patch_embed.proj(tubelets[~mask].reshape(B, -1, tubelets.shape[-1]))
        else:
            x = enc.patch_embed(frames)
            x = x[~mask].reshape(B, -1, x.shape[-1])
        x = x + pos
        for blk in enc.blocks:
            x = blk(x)
        return enc.fc_norm(x)

    def predict(
        self, frames: torch.Tensor, mask: torch.Tensor, decode_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder pixel predictions (B, N_dec, P) and the bool (B, N) positions they belong to.

        ``frames`` of any float dtype: the encoder gets them in its parameters' dtype."""
        self.encoder.check_input(frames)
        B = frames.shape[0]
        check_masks(mask, decode_mask, B, self.num_tokens)
        decode = mask if decode_mask is None else ~decode_mask
        frames = frames.to(self.encoder.patch_embed.proj.weight.dtype)
        vis = self.encoder_to_decoder(self.encode(frames, mask))
        C = vis.shape[-1]
        pos = self.decoder_pos.to(vis.dtype).expand(B, -1, -1)
        x = torch.cat(
            [vis + pos[~mask].reshape(B, -1, C), self.mask_token.to(vis.dtype) + pos[decode].reshape(B, -1, C)], dim=1
        )
        return self.decoder(x, int(decode[0].sum())), decode

    def forward(self, frames: torch.Tensor, mask: torch.Tensor, decode_mask: torch.Tensor | None = None) -> MAEOutput:
        """Loss of one batch. Pass ``frames`` in float32 whatever the model's dtype: the targets are
        computed from them in float32, as VideoMAE does (a bf16 clip loses the small differences
        inside a flat patch that ``norm_pix_loss`` scales up); the encoder casts them itself."""
        pred, decode = self.predict(frames, mask, decode_mask)
        B = frames.shape[0]
        with torch.no_grad():
            labels = pixel_targets(frames, self.arch)[decode].reshape(B, -1, pred.shape[-1])
            weight = mask[decode].reshape(B, -1).float()  # decoded AND hidden from the encoder
        per_token = (pred.float() - labels).pow(2).mean(dim=-1)
        loss = (per_token * weight).sum() / weight.sum().clamp_min(1.0)
        return MAEOutput(loss=loss, pred=pred, target=labels)

    def extra_repr(self) -> str:
        a = self.arch
        return (
            f"encoder={a.encoder.name}, decoder dim={a.decoder_dim} depth={a.decoder_depth} "
            f"heads={a.decoder_heads}, norm_pix_loss={a.norm_pix_loss}"
        )

"""Device-side augmentation: uint8 clips in, normalised float clips + targets out, all on the batch's device.

Frames cross the DataLoader as uint8 (T, H, W, C); here, on the GPU (or CPU), they become float
(B, C, T, H, W): resize if the decoder did not produce ``cfg.size``, scale + normalise
(:data:`avion_ds.config.normalization.MEAN_STD`: ImageNet, OpenAI-CLIP or AVION's "openai" statistics),
random horizontal flip (training), random erasing (``cfg.reprob``,
:class:`~avion_ds.data.erasing.ClipErasing` in pixel mode: one box per clip erased on every frame,
each view of a repeated sample drawn anew, as VideoMAE's fine-tuning does), then mixup/cutmix with label smoothing
through timm's ``Mixup`` (training, when ``cfg.mixup`` or ``cfg.cutmix`` > 0). Videos are mixed as
(B, C*T, H, W) views so cutmix boxes cut the same region out of every frame. EPIC's dict labels
get ONE lambda and permutation shared by the verb and noun targets.

Targets: int class tensors when no mixup/cutmix is active (eval, or training without mixing —
the loss then applies ``cfg.label_smoothing`` itself), else float soft targets (B, K); dicts per
head for EPIC. Multi-view eval input (B, V, T, H, W, C) becomes x (B*V, C, T, H, W) with labels
unchanged (B,) — aggregate the (B, V, K) logits with :func:`avion_ds.data.datasets.views.aggregate_views`.
Training input with repeated samples (``data.num_sample`` views) becomes B*V clips: a (B,) label is
repeated per view, a (B, V, ...) label (pretraining masks, one per view) flattened to (B*V, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from avion_ds.config import DataConfig
from avion_ds.config.normalization import MEAN_STD
from avion_ds.data.erasing import ClipErasing

Labels = torch.Tensor | dict[str, torch.Tensor]


class DeviceAugment:
    """Callable ``(frames uint8, labels) -> (x float (B, C, T, H, W), targets)`` on the frames' device."""

    def __init__(self, cfg: DataConfig, num_classes: int | dict[str, int], train: bool) -> None:
        if cfg.mean_std not in MEAN_STD:
            raise ValueError(f"data.mean_std={cfg.mean_std!r} is not one of {', '.join(MEAN_STD)}")
        self.cfg, self.num_classes, self.train = cfg, num_classes, train
        self.size = cfg.size
        mean, std = MEAN_STD[cfg.mean_std]
        self._mean = torch.tensor(mean).mul(255).view(1, 3, 1, 1, 1)
        self._std = torch.tensor(std).mul(255).view(1, 3, 1, 1, 1)
        self.mixup = None
        if train and (cfg.mixup > 0 or cfg.cutmix > 0):
            from timm.data import Mixup  # lazy: timm is heavy to import, needed only with mixup / cutmix

            # num_classes is only used by Mixup.__call__; dict heads use mixup_target per head
            k = num_classes if isinstance(num_classes, int) else max(num_classes.values())
            self.mixup = Mixup(
                mixup_alpha=cfg.mixup,
                cutmix_alpha=cfg.cutmix,
                label_smoothing=cfg.label_smoothing,
                num_classes=k,
                mode="batch",
            )
        self.erase = None
        if train and cfg.reprob > 0:
            self.erase = ClipErasing(probability=cfg.reprob, mode="pixel", max_count=1)

    @property
    def soft_targets(self) -> bool:
        """True when training targets come out as float (mixed, smoothed) distributions."""
        return self.mixup is not None

    def __call__(self, frames: torch.Tensor, labels: Labels) -> tuple[torch.Tensor, Labels]:
        if frames.dtype != torch.uint8:
            raise TypeError(f"DeviceAugment expects uint8 frames, got {frames.dtype}")
        device = frames.device
        if frames.dim() == 6:  # (B, V, T, H, W, C) multi-view
            v = frames.shape[1]
            frames = frames.flatten(0, 1)
            labels = _map(labels, lambda t: _per_view(t, v, self.train))
        elif frames.dim() != 5:
            raise ValueError(f"frames must be (B, T, H, W, C) or (B, V, T, H, W, C), got {tuple(frames.shape)}")
        x = frames.permute(0, 4, 1, 2, 3).float()  # (B, C, T, H, W)
        if x.shape[-2:] != (self.size, self.size):
            bsz, c, t, h, w = x.shape
            x = x.transpose(1, 2).reshape(bsz * t, c, h, w)
            x = F.interpolate(
                x, size=(self.size, self.size), mode=self.cfg.interpolation, align_corners=False, antialias=True
            )
            x = x.reshape(bsz, t, c, self.size, self.size).transpose(1, 2)
        x = x.sub_(self._mean.to(device)).div_(self._std.to(device))
        if self.train and self.cfg.hflip > 0:
            flip = torch.rand(x.shape[0], device=device) < self.cfg.hflip
            x = torch.where(flip.view(-1, 1, 1, 1, 1), x.flip(-1), x)
        x = x.contiguous()
        if self.erase is not None:  # one box per clip, on every frame (VideoMAE's cube erasing)
            self.erase(x)
        labels = _map(labels, lambda t: t.to(device, non_blocking=True))
        if self.mixup is None:
            return x, labels
        return x, self._mix(x, labels)

    def _mix(self, x: torch.Tensor, labels: Labels) -> Labels:
        """Mix the largest even prefix of the batch in place (timm needs pairs); one lambda for all heads."""
        from timm.data.mixup import mixup_target  # lazy: timm is heavy to import, needed only with mixup / cutmix

        n = x.shape[0] - x.shape[0] % 2
        smoothing = self.cfg.label_smoothing
        lam = 1.0
        if n >= 2:
            view = x[:n].flatten(1, 2)  # (n, C*T, H, W): cutmix cuts the same box in every frame
            lam = float(self.mixup._mix_batch(view))

        def target(t: torch.Tensor, k: int) -> torch.Tensor:
            out = mixup_target(t[:n], k, lam, smoothing) if n else t.new_zeros((0, k), dtype=torch.float32)
            if n < t.shape[0]:
                out = torch.cat([out, mixup_target(t[n:], k, 1.0, smoothing)])
            return out

        if isinstance(labels, dict):
            return {h: target(t, self.num_classes[h]) for h, t in labels.items()}
        return target(labels, int(self.num_classes))


def _per_view(t: torch.Tensor, views: int, train: bool) -> torch.Tensor:
    """Labels of ``views`` flattened views: (B, views, ...) per-view labels (pretraining masks, one per
    view) are flattened; (B, ...) labels are repeated per view in training, kept (B, ...) in eval
    (the views' scores are aggregated per sample)."""
    if t.dim() >= 3 and t.shape[1] == views:
        return t.flatten(0, 1)
    return t.repeat_interleave(views, dim=0) if train else t


def _map(labels: Labels, fn) -> Labels:
    return {k: fn(v) for k, v in labels.items()} if isinstance(labels, dict) else fn(labels)

"""The ``pretrain`` recipe section: masks and reconstruction target (registered with the Recipe)."""

from __future__ import annotations

from dataclasses import dataclass

from avion_ds.config import register_section


@dataclass
class PretrainConfig:
    """Masked-autoencoder pretraining (``avion_ds.tasks.pretrain``): masks and reconstruction target."""

    mask_type: str = "tube"  # tube | random (encoder mask)
    mask_ratio: float = 0.9
    decoder_mask_type: str = "none"  # none | running_cell (VideoMAE V2 dual masking)
    decoder_mask_ratio: float = 0.5
    norm_pix_loss: bool = True


register_section(
    "pretrain",
    PretrainConfig,
    choices={"mask_type": ("tube", "random"), "decoder_mask_type": ("none", "running_cell")},
)

"""The ``contrastive`` recipe section: what stays frozen (registered with the Recipe; ``task: mir`` reads
it too)."""

from __future__ import annotations

from dataclasses import dataclass

from avion_ds.config import register_section


@dataclass
class ContrastiveConfig:
    """Video-text contrastive pretraining (``avion_ds.tasks.contrastive``): what stays frozen."""

    freeze_temperature: bool = False  # AVION --freeze-temperature (its MODEL_ZOO commands set it)
    freeze_visual: bool = False  # the video tower gets no updates
    freeze_text: bool = False  # the text tower gets no updates


register_section("contrastive", ContrastiveConfig)

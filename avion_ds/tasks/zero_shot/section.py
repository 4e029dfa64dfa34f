"""The ``zeroshot`` recipe section: the prompt templates (registered with the Recipe)."""

from __future__ import annotations

from dataclasses import dataclass

from avion_ds.config import register_section


@dataclass
class ZeroShotConfig:
    """Zero-shot classification by text prompts (``avion_ds.tasks.zero_shot``)."""

    templates: str = "lavila"  # lavila: "#C C {}", "#C {}" (LaViLa --cls-use-template) | plain: "{}" | "fmt|fmt"


register_section("zeroshot", ZeroShotConfig)

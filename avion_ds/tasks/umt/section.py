"""The ``umt`` recipe section: the CLIP teacher, the masks and the distillation loss (registered with the Recipe)."""

from __future__ import annotations

from dataclasses import dataclass

from avion_ds.config import register_section

MASK_TYPES = ("attention", "tube", "random")
LOSS_TYPES = ("l2", "mse", "smooth_l1")


@dataclass
class UMTConfig:
    """Unmasked-teacher distillation (``avion_ds.tasks.umt``); names follow the official ``run_umt_pretraining.py``.

    ``teacher``: the CLIP weights (OpenAI / OpenCLIP / AVION / LaViLa file, or one of our dual-encoder runs
    or exports); ``teacher_model``: the registered dual encoder whose video tower reads them (its geometry).
    The decoders map the student's width to the teacher's projection width (``clip_output_dim`` of the
    reference is the teacher's; its ``clip_decoder_embed_dim`` is the student's)."""

    teacher: str = ""
    teacher_model: str = "clip_openai_vit_base_patch16_224"
    clip_input_resolution: int = 224  # the teacher's frame size; frames are resized bicubically to it
    clip_return_layer: int = 1  # how many of the last layers are distilled
    clip_return_interval: float = 1.0  # teacher: layers depth - int(i * interval) - 1
    clip_student_return_interval: float = 1.0  # student: the same rule on its depth
    clip_loss_type: str = "l2"  # l2 (2 - 2 cos) | mse | smooth_l1
    clip_loss_ratio: float = 1.0
    mask_type: str = "attention"  # attention (the teacher's class attention) | tube | random
    mask_ratio: float = 0.8


register_section(
    "umt",
    UMTConfig,
    choices={"mask_type": MASK_TYPES, "clip_loss_type": LOSS_TYPES},
    ranges={"clip_loss_ratio": (0.0, None, False, False), "clip_input_resolution": (1, None, True, False)},
)

"""The smallest ``task: umt`` recipe the UMT tests share: a student, a saved teacher, a one-clip chunk root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from avion_ds.models import create_model
from tests.helpers.data import placeholder_chunks


def tiny_umt_recipe(tmp: Path, **model: Any) -> dict[str, Any]:
    """A ``vit_test_tiny`` student (tubelet 1, ``model`` keys added) distilled from a ``clip_vit_test_tiny``
    teacher saved (seed 0) as ``tmp/teacher.safetensors``, over a one-clip chunk root under ``tmp``."""
    torch.manual_seed(0)
    teacher = tmp / "teacher.safetensors"
    save_file({k: v.contiguous() for k, v in create_model("clip_vit_test_tiny").state_dict().items()}, str(teacher))
    return {
        "task": "umt",
        "model": {"name": "vit_test_tiny", "tubelet_size": 1, **model},
        "data": {"root": str(placeholder_chunks(tmp / "chunks")), "num_frames": 4, "size": 32},
        "umt": {
            "teacher": str(teacher),
            "teacher_model": "clip_vit_test_tiny",
            "clip_input_resolution": 16,
            "clip_return_layer": 2,
            "mask_ratio": 0.5,
        },
        "precision": "fp32",
    }

"""Filling single fields of a DeepSpeed config, and the names around it (accelerator, precision -> dtype).

``fill_field`` sets a key that is absent or ``"auto"`` and rejects a concrete value that contradicts
the recipe. Reading a config's stage, offload, precision or batch is ``ds_plan.DSPlan``'s.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from avion_ds.config import ConfigError

AUTO = "auto"
PRECISIONS = ("fp32", "bf16", "fp16")  # names torch_dtype maps


def fill_field(section: dict, key: str, value: Any, where: str, close: bool = False) -> None:
    """Set ``section[key]`` when absent/"auto"; reject a concrete value that differs from ``value``."""
    current = section.get(key, AUTO)
    if current == AUTO or current is None:
        section[key] = value
        return
    if close and (isinstance(current, bool) or not isinstance(current, (int, float))):
        raise ConfigError(f'deepspeed config {where}={current!r} is not a number (write a number or "auto")')
    same = math.isclose(float(current), float(value), rel_tol=1e-9, abs_tol=0.0) if close else current == value
    if not same:
        raise ConfigError(
            f"deepspeed config {where}={current!r} conflicts with the recipe value {value!r}"
            ' (write "auto" in the JSON or change the recipe)'
        )


def accelerator_name() -> str:
    """The DeepSpeed accelerator's device name (cuda, cpu, ...), without a process group."""
    try:
        from deepspeed.accelerator import get_accelerator  # lazy: deepspeed takes seconds to import

        return str(get_accelerator().device_name())
    except Exception:  # noqa: BLE001  (deepspeed import problems surface later, in initialize)
        return "cpu"


def torch_dtype(precision: str) -> torch.dtype:
    """The compute dtype of a precision name (fp32 | bf16 | fp16); the one precision -> dtype map."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)

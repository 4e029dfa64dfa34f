"""Memory accounting and planning: exact activation bytes, per-GPU peak estimates, the
`avion-ds plan` configuration search (:mod:`avion_ds.memory.plan`), and ZeRO-3 parameter-offload (layer-streaming) inference.

Heavy imports (deepspeed) happen inside the functions that need them.
"""

from avion_ds.memory.activations import SavedTensorTracker, measure_activation_bytes
from avion_ds.memory.estimate import (
    MemoryEstimate,
    activation_bytes_per_clip,
    arch_info,
    estimate,
)
from avion_ds.memory.offload import wrap_for_inference
from avion_ds.memory.units import format_bytes, parse_bytes

__all__ = [
    "MemoryEstimate",
    "SavedTensorTracker",
    "activation_bytes_per_clip",
    "arch_info",
    "estimate",
    "format_bytes",
    "measure_activation_bytes",
    "parse_bytes",
    "wrap_for_inference",
]

"""A decoder backend that decodes nothing (bench/loader.py ``--parts helpercpu``): what is left when it
runs through the timeout helper is the helper mechanism's own cost (pipes, pickles, wake-ups, regions).

Its "fused crop" output is a 224x224 clip of the requested frames placed where the helper asks (``Decoder.alloc``), as a
real backend's resize output is; it is not written, so no decoding or copying work is timed.
"""

from __future__ import annotations

import torch

from avion_ds.data.decode.base import Decoder, register_backend

SIZE = 224


class NullDecoder(Decoder):
    name = "null"

    def _decode(self, path: str, indices: list[int], crop):
        shape = (len(indices), SIZE, SIZE, 3)
        out = self.alloc(shape) if self.alloc is not None else None
        return (out if out is not None else torch.empty(shape, dtype=torch.uint8)), True


register_backend("null", NullDecoder)

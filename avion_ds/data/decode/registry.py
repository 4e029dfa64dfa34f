"""The built-in decoder backends, registered on import (decord, torchcodec, pyav, torchcodec-cuda).

Imported by ``decoders`` (selection, probing) and by the ``decode_helper`` process, which needs the
backends but not the selection logic; plugins add more through ``decode_base.register_backend``.
"""

from __future__ import annotations

from avion_ds.data.decode.backend_decord import DecordDecoder
from avion_ds.data.decode.backend_pyav import PyAVDecoder
from avion_ds.data.decode.backend_torchcodec import (
    TorchCodecCudaDecoder,
    TorchCodecDecoder,
)
from avion_ds.data.decode.base import register_backend

__all__ = ["BACKENDS", "DecordDecoder", "PyAVDecoder", "TorchCodecCudaDecoder", "TorchCodecDecoder"]

register_backend("decord", DecordDecoder)
register_backend("torchcodec", TorchCodecDecoder)
register_backend("pyav", PyAVDecoder)
register_backend("torchcodec-cuda", TorchCodecCudaDecoder)
BACKENDS = ("decord", "torchcodec", "pyav")  # CPU backends, in preference order for ties

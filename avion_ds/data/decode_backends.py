"""The built-in decoder backends, registered on import (decord, torchcodec, pyav, torchcodec-cuda).

Imported by ``decoders`` (selection, probing) and by the ``decode_helper`` process, which needs the
backends but not the selection logic; plugins add more through ``decode_base.register_backend``.
"""

from __future__ import annotations

from .decode_base import register_backend
from .decode_decord import DecordDecoder
from .decode_pyav import PyAVDecoder
from .decode_torchcodec import TorchCodecCudaDecoder, TorchCodecDecoder

__all__ = ["BACKENDS", "DecordDecoder", "PyAVDecoder", "TorchCodecCudaDecoder", "TorchCodecDecoder"]

register_backend("decord", DecordDecoder)
register_backend("torchcodec", TorchCodecDecoder)
register_backend("pyav", PyAVDecoder)
register_backend("torchcodec-cuda", TorchCodecCudaDecoder)
BACKENDS = ("decord", "torchcodec", "pyav")  # CPU backends, in preference order for ties

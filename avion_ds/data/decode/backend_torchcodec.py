"""torchcodec backends: ``torchcodec`` (CPU, decoder-native crop + resize) and ``torchcodec-cuda`` (NVDEC).

CPU: a crop at a CHOSEN position through the private ``DecoderTransform._make_transform_spec``
hook ("crop, h, w, left, top", torchcodec pinned to >=0.17,<0.18 in setup.cfg), then
torchvision's bilinear antialiased resize kernel (the reference's arithmetic). torchcodec 0.17
runs decoder transforms in a filter graph AFTER its RGB conversion (``format=rgb24,crop=...``,
CpuDeviceInterface.cpp, note "Transform and Format Conversion Order"), so the hook saves the copy
of the pixels outside the box, not their conversion (16 frames of the bench chunk, CPU: no
transform 13.7 ms, whole-frame crop 12.8, a 32x32 crop 11.3; loaded machine). torchcodec's own
``Resize`` (swscale after the RGB conversion) was slower still: 21.4 vs 15.4 ms CPU per clip for
hook + torch resize (0.03/255 off the reference). The hook is private: if
torchcodec rejects it, the backend logs one warning and falls back to decode + crop/resize on
the uint8 frames (tests/data/test_decoders.py guards both).

Seeking: with ``exact=False`` (chunked datasets) the decoder opens in torchcodec's
``approximate`` mode (frame i at pts i / fps from the header, no scan of the whole file); the
returned timestamps are checked against that, and a file whose frames are not where the header
says (variable frame rate, shifted start) is re-read in ``exact`` mode, with one warning.

CUDA (``torchcodec-cuda``): NVDEC decodes on the GPU, the crop + bilinear antialiased resize run
on the GPU, and the (small) clip is copied to the CPU so it flows through DataLoader workers and
the timeout helper like any other backend. Unavailable (one clear line) without a CUDA device.
"""

from __future__ import annotations

import logging

from avion_ds.data.crop import CropBox, CropSpec
from avion_ds.data.decode.base import Decoder, DecoderUnavailable, MemoryVideo, reason, require
from avion_ds.data.errors import DataError

log = logging.getLogger(__name__)
_INSTALL = "pip install torchcodec and install FFmpeg shared libraries (Debian/Ubuntu: apt-get install ffmpeg)"


class CropHook:
    """torchcodec decoder transform: crop at a chosen (top, left) via the private spec hook."""

    def __new__(cls, box: CropBox):  # built lazily so the module imports without torchcodec
        from torchcodec.transforms import DecoderTransform  # lazy: torchcodec is an optional decoder backend

        class CropAt(DecoderTransform):
            def __init__(self, b: CropBox) -> None:
                self.box = b

            def _make_transform_spec(self, input_dims: tuple[int | None, int | None]) -> str:
                b = self.box
                return f"crop, {b.height}, {b.width}, {b.left}, {b.top}"

            def _get_output_dims(self) -> tuple[int | None, int | None] | None:
                return (self.box.height, self.box.width)

        return CropAt(box)


class TorchCodecDecoder(Decoder):
    """torchcodec VideoDecoder with decoder-native crop (private hook) + Resize; falls back if rejected."""

    name = "torchcodec"
    device = "cpu"

    def __init__(self, threads: int = 1, fuse: bool = True, exact: bool = True) -> None:
        super().__init__(threads, fuse, exact)
        self.hook_ok: bool | None = None  # None: untested, False: fell back
        self._warned_pts = False

    @classmethod
    def check_available(cls) -> None:
        require(cls.name, "torchcodec.decoders", _INSTALL)

    def _open(self, path: str | MemoryVideo, transforms: list | None, exact: bool):
        from torchcodec.decoders import VideoDecoder  # lazy: torchcodec is an optional decoder backend

        return VideoDecoder(
            path.data if isinstance(path, MemoryVideo) else path,  # torchcodec reads bytes as they are
            dimension_order="NHWC",
            num_ffmpeg_threads=self.threads,
            device=self.device,
            seek_mode="exact" if exact else "approximate",
            transforms=transforms,
        )

    def _open_fused(self, path: str | MemoryVideo, crop: CropSpec | None, exact: bool):
        """(decoder, crop fused?) — the crop hook when allowed, else a plain decoder."""
        if crop is None or not self.fuse or self.hook_ok is False:
            return self._open(path, None, exact), crop is None
        try:
            dec = self._open(path, [CropHook(crop.for_frame(crop.frame_h, crop.frame_w))], exact)
        except Exception as e:  # noqa: BLE001 - a newer torchcodec may reject the private hook
            plain = self._open(path, None, exact)  # raises for a bad file: then it was not the hook
            if self.hook_ok is None:
                log.warning(
                    "torchcodec rejected the crop-at-position hook (%s); cropping after decode instead", reason(e)
                )
            self.hook_ok = False
            return plain, False
        self.hook_ok = True
        return dec, True

    def _read(self, path: str | MemoryVideo, indices: list[int], crop: CropSpec | None, exact: bool):
        dec, fused = self._open_fused(path, crop, exact)
        n = dec.metadata.num_frames
        if n is not None and indices[-1] >= n:
            raise self._too_few(path, n, indices[-1])
        batch = dec.get_frames_at(indices)
        return batch, dec.metadata, fused

    def _decode(self, path: str | MemoryVideo, indices: list[int], crop: CropSpec | None):
        batch, meta, fused = self._read(path, indices, crop, self.exact)
        if not self.exact and not _on_grid(batch.pts_seconds.tolist(), indices, meta):
            if not self._warned_pts:
                log.warning(
                    "%s: frames are not at index / fps (variable frame rate?); torchcodec re-reads such "
                    "files in exact seek mode",
                    path,
                )
                self._warned_pts = True
            batch, meta, fused = self._read(path, indices, crop, True)
        return self._to_output(batch.data, crop, fused), True

    def _to_output(self, frames, crop: CropSpec | None, fused: bool):
        if crop is None:
            return frames
        if fused:  # the decoder cropped (only the box was converted to RGB); resize like the reference
            box = crop.for_frame(crop.frame_h, crop.frame_w)
            return self._crop_resize(frames, None, crop.size or (box.height, box.width))
        h, w = frames.shape[1:3]
        return self._crop_resize(frames, crop.for_frame(h, w), crop.out_size(h, w))


def _on_grid(pts: list[float], indices: list[int], meta) -> bool:
    """Each returned timestamp is within half a frame of begin + index / fps."""
    fps, begin = meta.average_fps, meta.begin_stream_seconds or 0.0
    if not fps:
        return False
    return all(abs(p - begin - i / fps) < 0.5 / fps for p, i in zip(pts, indices, strict=True))


class TorchCodecCudaDecoder(TorchCodecDecoder):
    """torchcodec on NVDEC: decode + crop + resize on the GPU, the clip returned on the CPU."""

    name = "torchcodec-cuda"
    device = "cuda"

    def __init__(self, threads: int = 1, fuse: bool = True, exact: bool = True) -> None:
        super().__init__(threads, False, exact)  # the crop runs as torch ops on the GPU, not as decoder transforms

    @classmethod
    def check_available(cls) -> None:
        require(cls.name, "torchcodec.decoders", _INSTALL)
        import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

        if not torch.cuda.is_available():
            raise DecoderUnavailable(
                f"decoder {cls.name!r} is not available (no CUDA device here); "
                "use data.decoder=auto or a CPU backend (decord, torchcodec, pyav)"
            )

    def _to_output(self, frames, crop: CropSpec | None, fused: bool):
        if frames.device.type != "cuda":
            raise DataError(f"torchcodec returned frames on {frames.device}, not on the GPU")
        return super()._to_output(frames, crop, fused).cpu()

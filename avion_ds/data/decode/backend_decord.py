"""decord backend: accurate ``get_batch`` on sorted unique indices, crop + resize on the uint8 frames.

decord has no crop transform; its decode-time resize (``width=``/``height=``, FFmpeg's default
bicubic scaler over the whole frame) differed from the bilinear antialiased reference crop by
1.2-1.8/255 on average on the frame-index test video, so the fused path crops + resizes the
uint8 frames with torchvision right after ``get_batch`` (exactly the reference's arithmetic, ~5 ms
for 16 frames to 224 px). "Fused" here means it happens inside the decoder (and so inside the
timeout helper, which then ships the small clip instead of full frames).
"""

from __future__ import annotations

from avion_ds.data.crop import CropSpec
from avion_ds.data.decode.base import Decoder, MemoryVideo, file_like, require


class DecordDecoder(Decoder):
    """decord VideoReader (one per call) + accurate get_batch; crop + resize on the decoded uint8."""

    name = "decord"

    @classmethod
    def check_available(cls) -> None:
        require("decord", "decord", "pip install decord")

    def _decode(self, path: str | MemoryVideo, indices: list[int], crop: CropSpec | None):
        import decord  # lazy: an optional decoder backend, imported when it decodes
        import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

        vr = decord.VideoReader(file_like(path), ctx=decord.cpu(0), num_threads=self.threads)
        n = len(vr)
        if indices[-1] >= n:
            raise self._too_few(path, n, indices[-1])
        frames = vr.get_batch(indices).asnumpy()
        del vr  # stop decord's own decode thread now: alive, it keeps decoding ahead while we crop (2 cores)
        if crop is None or not self.fuse:
            return frames, crop is None
        h, w = frames.shape[1:3]
        return self._crop_resize(torch.from_numpy(frames), crop.for_frame(h, w), crop.out_size(h, w)), True

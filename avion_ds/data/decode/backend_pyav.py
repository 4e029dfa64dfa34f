"""PyAV backend: seek to the keyframe before the first wanted frame, decode forward, and run each
wanted frame through an FFmpeg filter graph ``crop (even-aligned) -> rgb24``, so only the crop is
converted to RGB (exactly the pixels a full-frame conversion gives); the box is then sliced and
resized with torchvision's bilinear antialiased kernel (the reference's arithmetic). Every FFmpeg
stage runs at ``threads`` (1 by default): left at FFmpeg's default, the filter graph started a
thread per core for every clip and each uncropped ``to_ndarray`` conversion two threads per frame
(counted with ``strace -f -e clone``), against the one-thread-per-worker budget. An FFmpeg
``scale`` in the graph was measured 0.8-3.4/255 away from that reference on the frame-index test
video and slower than the plain conversion (0.82x of PyAV's decode floor on the mandelbrot bench)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from avion_ds.data.crop import CropSpec, even_superset
from avion_ds.data.decode.base import Decoder, MemoryVideo, file_like, require
from avion_ds.data.errors import DataError


class PyAVDecoder(Decoder):
    """PyAV: keyframe seek + forward decode; crop before the RGB conversion in an FFmpeg filter graph."""

    name = "pyav"

    @classmethod
    def check_available(cls) -> None:
        require("pyav", "av", "pip install av")

    def _graph(self, stream, crop: CropSpec):
        """crop (even-aligned superset of the box) -> rgb24: only the crop is converted to RGB.

        Returns (graph, box relative to the graph's output, output size).
        """
        import av.filter  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

        h, w = stream.codec_context.height, stream.codec_context.width
        outer, rel = even_superset(crop.for_frame(h, w), h, w)
        g = av.filter.Graph()
        g.threads = self.threads  # FFmpeg's default (0) starts a thread per core for every graph
        nodes = [g.add_buffer(template=stream)]
        if (outer.height, outer.width) != (h, w):
            nodes.append(g.add("crop", f"{outer.width}:{outer.height}:{outer.left}:{outer.top}:exact=1"))
        nodes += [g.add("format", "pix_fmts=rgb24"), g.add("buffersink")]
        for a, b in pairwise(nodes):
            a.link_to(b)
        g.configure()
        return g, rel, crop.out_size(h, w)

    def _decode(self, path: str | MemoryVideo, indices: list[int], crop: CropSpec | None):
        import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

        want = set(indices)
        out: dict[int, np.ndarray] = {}
        with av.open(file_like(path)) as c:
            if not c.streams.video:
                raise DataError(f"{path}: no video stream")
            s = c.streams.video[0]
            s.thread_count = self.threads
            fps = s.average_rate or s.guessed_rate
            tb, t0 = s.time_base, s.start_time or 0
            graph, rel, size = self._graph(s, crop) if crop is not None and self.fuse else (None, None, None)
            use_pts = fps is not None and tb is not None
            if use_pts and indices[0] > 0:
                c.seek(int(t0 + indices[0] / fps / tb), stream=s, backward=True, any_frame=False)
            count, last = 0, -1
            for frame in c.decode(s):
                if use_pts and frame.pts is None:  # no timestamps: restart and count frames instead
                    return self._decode_counting(path, indices, crop)
                i = int(round((frame.pts - t0) * tb * fps)) if use_pts else count
                count, last = count + 1, i
                if i in want:
                    if graph is not None:
                        graph.push(frame)
                        out[i] = graph.pull().to_ndarray()[
                            rel.top : rel.top + rel.height, rel.left : rel.left + rel.width
                        ]
                    else:
                        out[i] = frame.to_ndarray(format="rgb24", threads=self.threads)
                if i >= indices[-1]:
                    break
        if len(out) != len(indices):
            missing = [i for i in indices if i not in out]
            raise DataError(
                f"{path}: decoding stopped at frame {last}, asked for frame {missing[0]} "
                f"(file shorter than its manifest?)"
            )
        frames = np.stack([out[i] for i in indices])
        if graph is None:
            return frames, crop is None
        import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

        return self._crop_resize(torch.from_numpy(frames), None, size), True

    def _decode_counting(self, path: str | MemoryVideo, indices: list[int], crop: CropSpec | None):
        import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

        want, out = set(indices), {}
        with av.open(file_like(path)) as c:
            s = c.streams.video[0]
            for i, frame in enumerate(c.decode(s)):
                if i in want:
                    out[i] = frame.to_ndarray(format="rgb24", threads=self.threads)
                if i >= indices[-1]:
                    break
        if len(out) != len(indices):
            raise self._too_few(path, len(out), indices[-1])
        return np.stack([out[i] for i in indices]), crop is None

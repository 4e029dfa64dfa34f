"""Every decode path returns exactly the AVION-style reference's frames and crops.

Reference (independent of the project's decoders): ``decord.VideoReader(path, num_threads=1)``,
``get_batch`` of the clip's frames, torchvision v2 ``resized_crop`` (bilinear, antialias) on the
uint8 frames. The test video's frames carry their own index (barcode) and its colours move by a
few levels per frame, so a path that returns a neighbouring frame differs from the reference by
~3/255 on average while the right frame differs by <= 1.5/255 (the bound asserted here).
"""

from __future__ import annotations

import os
import signal

import decord
import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as F

from avion_ds.data.crop import CropBox, CropSpec, clip_rng, random_resized_crop
from avion_ds.data.decode.helper import SLOTS
from avion_ds.data.decode.select import available_backends, get_decoder
from avion_ds.data.prep.chunking import chunk_videos
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.synthetic import read_frame_index, write_video

BACKENDS = available_backends()
PATHS = [(b, fuse, t) for b in BACKENDS for fuse, t in ((True, 0.0), (False, 0.0), (True, 30.0))]
LOCAL = [[0, 3, 3, 9, 17, 30, 47, 59], [2, 5, 8, 11, 14, 17, 20, 35]]  # sorted, a repeat, across GOPs (16)
SIZE = 112


def reference(path: str, local: list[int], box, size: int | None) -> torch.Tensor:
    vr = decord.VideoReader(path, num_threads=1)
    x = torch.from_numpy(vr.get_batch(local).asnumpy())
    if box is None:
        return x
    x = F.resized_crop(
        x.permute(0, 3, 1, 2),
        box.top,
        box.left,
        box.height,
        box.width,
        [size, size],
        interpolation=F.InterpolationMode.BILINEAR,
        antialias=True,
    )
    return x.permute(0, 2, 3, 1)


def _mad(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


@pytest.fixture(scope="module")
def chunk(tmp_path_factory):
    """A 426x240 frame-index video chunked by `avion-ds chunk` defaults (GOP 16) into 2 s chunks."""
    d = tmp_path_factory.mktemp("paths")
    write_video(d / "src" / "v.mp4", 96, 426, 240, fps=30)
    assert not chunk_videos(d / "src", d / "chunks", chunk_seconds=2.0, progress=False).failed
    return load_manifest(d / "chunks")["v"].chunks[0]


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    """Random pixels: a crop box off by one pixel is ~80/255 away from the reference here."""
    return str(write_video(tmp_path_factory.mktemp("noise") / "n.mp4", 24, 240, 160, pattern="noise", gop=16))


@pytest.mark.parametrize("name,fuse,timeout", PATHS)
def test_path_returns_the_reference_frames_and_crops(name, fuse, timeout, chunk, noise) -> None:
    dec = get_decoder(name, fuse=fuse, timeout_s=timeout, exact=False)  # exact=False: as the chunked datasets
    try:
        for box in (CropBox(11, 33, 101, 87), CropBox(40, 61, 37, 29)):  # the box itself, on random pixels
            local = [1, 2, 19, 23]
            out = dec.decode(noise, local, CropSpec(box, (SIZE, SIZE), 160, 240))
            assert _mad(out, reference(noise, local, box, SIZE)) <= 1.5
        for local in LOCAL[:1] if timeout else LOCAL:  # the helper only moves frames: one list is enough
            full = dec.decode(chunk.path, local)
            assert [read_frame_index(f) for f in full.numpy()] == local
            assert _mad(full, reference(chunk.path, local, None, None)) <= 1.5
            rrc = random_resized_crop(chunk.height, chunk.width, (0.08, 1.0), (0.75, 4 / 3), clip_rng(1, 0, 0))
            for box in (rrc, CropBox(37, 101, 61, 47)):  # 208x270 downscaled; odd offsets, tiny, upscaled
                out = dec.decode(chunk.path, local, CropSpec(box, (SIZE, SIZE), chunk.height, chunk.width))
                ref = reference(chunk.path, local, box, SIZE)
                near = reference(chunk.path, [i + 1 if i + 1 < chunk.frames else i - 1 for i in local], box, SIZE)
                assert out.shape == ref.shape == (len(local), SIZE, SIZE, 3)
                for j in range(len(local)):  # per frame: the right frame, within 1.5/255, and not a neighbour
                    own, other = _mad(out[j], ref[j]), _mad(out[j], near[j])
                    assert own <= 1.5 and other > own + 1.0, (name, fuse, local[j], own, other)
    finally:
        if hasattr(dec, "close"):
            dec.close()


def test_helper_moves_frames_through_anonymous_memory(chunk) -> None:
    """Frames equal the in-process ones, the shared buffer grows for big reads, /dev/shm stays empty."""
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    dec = get_decoder("pyav", timeout_s=30.0)
    try:
        small = dec.decode(chunk.path, [1, 4], CropSpec(None, (32, 32), chunk.height, chunk.width))
        big = dec.decode(chunk.path, list(range(40)))  # 40 full frames: 12 MB > the 2.4 MB initial buffer
        assert torch.equal(big, get_decoder("pyav").decode(chunk.path, list(range(40))))
        assert small.shape == (2, 32, 32, 3) and big.shape == (40, 240, 426, 3)
        fd = dec.region(SLOTS).fd  # whole frames (> SLOT_MAX_BYTES) come through the scratch region
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:avion_ds_frames")
        assert os.fstat(fd).st_size >= big.numel()
        pid = dec.helper_pid
        os.kill(pid, signal.SIGKILL)  # as a crash would, behind the decoder's back
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, but left for the decoder to find and reap
        again = dec.decode(chunk.path, [1, 4], CropSpec(None, (32, 32), chunk.height, chunk.width))
        assert torch.equal(again, small) and dec.helper_pid != pid  # a fresh helper, same buffer
    finally:
        dec.close()
    if os.path.isdir("/dev/shm"):  # nothing named was created (or left behind); other jobs may add theirs
        assert not {n for n in set(os.listdir("/dev/shm")) - shm if "avion" in n or "frames" in n}


@pytest.mark.parametrize("name", BACKENDS)
def test_fused_crop_writes_into_the_given_buffer(name, chunk) -> None:
    """The backend's fused crop writes its frames into ``alloc``'s tensor (the helper's shared region): no copy."""
    dec = get_decoder(name, exact=False)
    given = []

    def alloc(shape):
        given.append(torch.empty(shape, dtype=torch.uint8))
        return given[-1]

    dec.alloc = alloc
    spec = CropSpec(CropBox(37, 101, 61, 47), (SIZE, SIZE), chunk.height, chunk.width)
    out, done = dec.decode_raw(chunk.path, [2, 5, 8], spec)
    assert done and len(given) == 1 and out.data_ptr() == given[0].data_ptr()
    dec.alloc = None
    assert torch.equal(out, dec.decode(chunk.path, [2, 5, 8], spec))


def test_helper_hands_out_regions_only_while_free(chunk) -> None:
    """Frames handed out without a copy stay valid through later decodes; regions are reused once released."""
    inproc, dec = get_decoder("pyav", exact=False), get_decoder("pyav", timeout_s=30.0, exact=False)
    spec = CropSpec(CropBox(10, 20, 200, 300), (SIZE, SIZE), chunk.height, chunk.width)
    clips = [[i, i + 7] for i in range(SLOTS + 3)]  # more clips held at once than there are regions
    try:
        held = [dec.decode(chunk.path, c, spec) for c in clips]
        for c, frames in zip(clips, held, strict=True):
            assert torch.equal(frames, inproc.decode(chunk.path, c, spec)), c
        assert (
            dec.region_states() == ["in use"] * SLOTS
        )  # all regions in use: the last three were copied out of the scratch
        del held[:2]
        again = dec.decode(chunk.path, clips[0], spec)
        assert torch.equal(again, inproc.decode(chunk.path, clips[0], spec))
        assert dec.region_states()[:3] == ["in use", "free", "in use"]  # region 0 reused, region 1 released
        for c, frames in zip(clips[2:], held, strict=True):  # still untouched by the reuse
            assert torch.equal(frames, inproc.decode(chunk.path, c, spec)), c
    finally:
        dec.close()


def test_helper_never_reuses_a_region_held_across_a_fork(chunk) -> None:
    """After a fork the child may still read frames it inherited: the parent never writes that region again."""
    dec = get_decoder("pyav", timeout_s=30.0, exact=False)
    spec = CropSpec(None, (SIZE, SIZE), chunk.height, chunk.width)
    try:
        held = dec.decode(chunk.path, [1, 2], spec)
        pid = os.fork()
        if pid == 0:  # the child only has to exist
            os._exit(0)
        os.waitpid(pid, 0)
        expected = held.clone()
        del held  # gone here, but a forked child could still hold its copy
        later = [dec.decode(chunk.path, [i], spec) for i in range(3)]
        assert dec.region_states()[0] == "retired" and all(f.shape == (1, SIZE, SIZE, 3) for f in later)
        view = np.frombuffer(dec.region(0).view(), np.uint8, expected.numel())
        assert torch.equal(torch.from_numpy(view.copy()).view(expected.shape), expected)  # never overwritten
    finally:
        dec.close()

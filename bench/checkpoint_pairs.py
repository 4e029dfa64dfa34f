"""Activation-checkpoint policies side by side with the reference stacks, in ONE process.

Pairs (``--pairs``, comma separated):

* ``avion``    the dual encoder: ours (``clip_vit_base_patch16_224``) vs AVION's own model code, imported
               from ``--avion-src DIR`` (a clone of github.com/zhaoyue-zephyrus/AVION; nothing of it is
               copied here), AVION's weights loaded into ours (our AVION-format loader); CLIP's symmetric
               loss over the batch; 4 x 224 frames + 77-token captions.
* ``finetune`` ours (``vit_base_patch16_224``, 400 classes) vs Hugging Face ``VideoMAEForVideoClassification``
               (bench/peer.py's pair), cross-entropy.
* ``pretrain`` ours (``pretrain_videomae_base_patch16_224``) vs ``VideoMAEForPreTraining`` (bench/pretrain.py's
               setting: HF's weights loaded into ours, one 0.9 tube mask per clip).
* ``self``     ours alone on ``--self-model`` (ViT-B 16 x 224 fine-tuning): the checkpoint policies against
               no checkpointing.

Variants per pair: ours with checkpointing ``off`` / ``full`` / ``selective`` (``model.activation_checkpoint_policy``),
the reference ``off`` / ``full`` (what it offers), and with ``--compile`` ours with compiled blocks.
A step = forward + loss + backward (the optimizer step is the same code on both sides). Timing:
``--warmup`` rounds, then ``--repeats`` rounds, every round running each variant once in turn (A/B
alternating); the median per variant. Saved bytes: the exact saved-tensor count of one forward
(``SavedTensorTracker``). Ratios: ours / reference at the same checkpointing (``selective`` against the
reference's ``full``, the recipe it replaces), and ours-selective / ours-off.

``--profile``: instead of the timing, ``--warmup`` unprofiled rounds, then ``--repeats`` rounds with every
step under ``torch.profiler`` (still alternating; ``--variants off,full`` keeps only those policies);
per pair of ours / the reference at the same checkpointing, each op's self time per phase (``fwd``, or
``bwd``: gradients plus what a checkpoint recomputes) as a share of its variant's op time side by side
(``bench/checkpoint_profile.py``'s table), then the ops whose shares differ most, each also in units of
its variant's matmul time (``mm`` + ``addmm`` + ``bmm``: the same multiply-adds on both sides, so that
unit does not move with the load), and the step-time ratio those units imply.

    python bench/checkpoint_pairs.py --pairs avion --avion-src /tmp/AVION --batch 4     # CPU: minutes
    python bench/checkpoint_pairs.py --pairs finetune,pretrain,self --frames 16 --batch 1
    python bench/checkpoint_pairs.py --device cuda --dtype bf16 --pairs avion,finetune,pretrain --compile
    python bench/checkpoint_pairs.py --pairs avion --avion-src /tmp/AVION --batch 2 --profile --variants off,full
    python bench/checkpoint_pairs.py --pairs avion --avion-src /tmp/AVION --patch-dropout 0.5   # + FLIP rows
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.memory.activations import SavedTensorTracker
from avion_ds.memory.units import format_bytes
from avion_ds.models import apply_activation_checkpointing, create_model, remove_activation_checkpointing
from avion_ds.models.activation_checkpointing import compile_blocks
from bench.checkpoint_profile import by_op, mean_tables, print_table

Step = Callable[[], torch.Tensor]  # forward + loss; the loop runs backward


class Variant:
    """One row: a model, its loss closure, and how to switch its checkpointing on before it runs."""

    def __init__(self, name: str, model: torch.nn.Module, loss: Step, setup: Callable[[], None]) -> None:
        self.name, self.model, self.loss, self.setup = name, model, loss, setup
        self.times: list[float] = []
        self.saved = 0


def _ours_setup(model: torch.nn.Module, policy: str | None) -> Callable[[], None]:
    def setup() -> None:
        if policy is None:
            remove_activation_checkpointing(model)
        else:
            apply_activation_checkpointing(model, policy=policy)

    return setup


def _ours_variants(tag: str, model: torch.nn.Module, loss_of: Callable[[torch.nn.Module], Step], compiled: bool):
    rows = [
        Variant(f"{tag} {p or 'off'}", model, loss_of(model), _ours_setup(model, p))
        for p in (None, "full", "selective")
    ]
    if compiled:
        for policy in (None, "full", "selective"):
            twin = copy.deepcopy(model)
            if policy:
                apply_activation_checkpointing(twin, policy=policy)
            compile_blocks(twin)
            rows.append(Variant(f"{tag} {policy or 'off'} compiled", twin, loss_of(twin), lambda: None))
    return rows


# ---------------------------------------------------------------------------------------------- pairs
def _import_avion(src: str) -> types.ModuleType:
    """AVION's ``avion.models.model_clip`` from a clone; flash-attn and OpenAI's ``clip`` package (imported
    at module level there, unused without ``use_flash_attn`` / OpenAI weights) are stubbed when missing."""
    sys.path.insert(0, str(Path(src).resolve()))
    for name in ("flash_attn", "flash_attn.modules", "flash_attn.modules.mha", "flash_attn.modules.mlp", "clip"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.MHA = stub.Mlp = None  # type: ignore[attr-defined]
            sys.modules[name] = stub
    from avion.models import model_clip  # type: ignore[import-not-found]

    return model_clip


def _clip_loss(video: torch.Tensor, text: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    logits = scale * video @ text.t()
    target = torch.arange(video.shape[0], device=video.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def pair_avion(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[Variant]:
    if not args.avion_src:
        raise SystemExit("--pairs avion needs --avion-src DIR (a clone of github.com/zhaoyue-zephyrus/AVION)")
    mc = _import_avion(args.avion_src)
    from avion.models.transformer import TextTransformer, VisionTransformer  # type: ignore[import-not-found]

    torch.manual_seed(0)
    vision = VisionTransformer(224, 16, 768, 12, 12, 4, output_dim=256, num_frames=args.frames)
    text = TextTransformer(context_length=77, vocab_size=49408, width=512, heads=8, layers=12, output_dim=256)
    avion = mc.CLIP(embed_dim=256, vision_model=vision, text_model=text)
    ours = create_model("clip_vit_base_patch16_224", num_frames=args.frames, attn_backend=args.attn)
    from avion_ds.models import load_weights

    report = load_weights(ours, {"state_dict": avion.state_dict()})
    print(f"[avion] weights: {report.summary()}")
    avion, ours = avion.to(device, dtype), ours.to(device, dtype)
    x = torch.randn(args.batch, 3, args.frames, 224, 224, device=device, dtype=dtype)
    tokens = torch.randint(1, 49406, (args.batch, 77), device=device)
    tokens[:, -1] = 49407  # end of text: the row's largest id
    rows = _ours_variants("ours", ours, lambda m: lambda: _clip_loss(*m(x, tokens)), args.compile)
    for ck in (False, True):

        def setup(ck: bool = ck) -> None:
            avion.visual.set_grad_checkpointing(ck)
            avion.textual.set_grad_checkpointing(ck)

        rows.append(Variant(f"AVION {'full' if ck else 'off'}", avion, lambda: _clip_loss(*avion(x, tokens)), setup))
    if args.patch_dropout:
        rows += _patch_dropout_rows(args, mc, avion, x, tokens)
    return rows


def _patch_dropout_rows(args: argparse.Namespace, mc: types.ModuleType, avion: torch.nn.Module, x, tokens) -> list:
    """Ours and AVION's dual encoders with ``--patch-dropout`` of the video patches in training (FLIP; both
    codes drop at random, the class token kept), both with full checkpointing as AVION's recipe trains, and the
    same weights as the pair's models."""
    from avion.models.transformer import VisionTransformer  # type: ignore[import-not-found]

    p = args.patch_dropout
    torch.manual_seed(0)
    vision = VisionTransformer(224, 16, 768, 12, 12, 4, output_dim=256, num_frames=args.frames, patch_dropout=p)
    dropped = mc.CLIP(embed_dim=256, vision_model=vision, text_model=copy.deepcopy(avion.textual))
    dropped.load_state_dict(avion.state_dict())
    dropped = dropped.to(x.device, x.dtype)
    ours = create_model("clip_vit_base_patch16_224", num_frames=args.frames, attn_backend=args.attn, patch_dropout=p)
    from avion_ds.models import load_weights

    load_weights(ours, {"state_dict": avion.state_dict()})
    ours = ours.to(x.device, x.dtype)

    def avion_full() -> None:
        dropped.visual.set_grad_checkpointing(True)
        dropped.textual.set_grad_checkpointing(True)

    return [
        Variant(f"ours full pd={p:g}", ours, lambda: _clip_loss(*ours(x, tokens)), _ours_setup(ours, "full")),
        Variant(f"AVION full pd={p:g}", dropped, lambda: _clip_loss(*dropped(x, tokens)), avion_full),
    ]


def pair_finetune(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[Variant]:
    from bench.peer import build_pair, hf_forward

    torch.manual_seed(0)
    ours, hf = build_pair("vit_base_patch16_224", args.frames, args.size, args.attn, device, dtype)
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    y = torch.randint(0, 400, (args.batch,), device=device)
    rows = _ours_variants("ours", ours, lambda m: lambda: F.cross_entropy(m(x).float(), y), args.compile)
    return rows + _hf_variants(hf, lambda: F.cross_entropy(hf_forward(hf, x).float(), y))


def _hf_variants(hf: torch.nn.Module, loss: Step) -> list[Variant]:
    def setup(ck: bool) -> Callable[[], None]:
        return lambda: hf.gradient_checkpointing_enable() if ck else hf.gradient_checkpointing_disable()

    return [Variant(f"HF {'full' if ck else 'off'}", hf, loss, setup(ck)) for ck in (False, True)]


def pair_pretrain(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[Variant]:
    import transformers

    from avion_ds.models import load_weights
    from bench.pretrain import _tube

    torch.manual_seed(0)
    cfg = transformers.VideoMAEConfig(
        norm_pix_loss=True, use_mean_pooling=False, layer_norm_eps=1e-6, attn_implementation="sdpa",
        num_frames=args.frames, image_size=args.size,
    )  # fmt: skip
    hf = transformers.VideoMAEForPreTraining(cfg)
    ours = create_model(
        "pretrain_videomae_base_patch16_224", attn_backend="sdpa", decoder_norm_eps=1e-5,
        num_frames=args.frames, img_size=args.size,
    )  # fmt: skip
    load_weights(ours, hf.state_dict(), strict=True)
    ours, hf = ours.to(device, dtype), hf.to(device, dtype)
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    xt = x.transpose(1, 2).contiguous()
    mask = _tube(args.batch, ours.encoder.patch_embed.grid, 1).to(device)
    rows = _ours_variants("ours", ours, lambda m: lambda: m(x, mask).loss, args.compile)
    return rows + _hf_variants(hf, lambda: hf(xt, bool_masked_pos=mask).loss)


def pair_self(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[Variant]:
    torch.manual_seed(0)
    ours = create_model(args.self_model, num_frames=args.frames, img_size=args.size, drop_path_rate=0.1)
    ours = ours.to(device, dtype)
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=device, dtype=dtype)
    with torch.no_grad():
        classes = ours(x[:1]).shape[-1]  # the model's own head size (tiny test sizes have fewer than 400)
    y = torch.randint(0, classes, (args.batch,), device=device)
    return _ours_variants("ours", ours, lambda m: lambda: F.cross_entropy(m(x).float(), y), args.compile)


PAIRS = {"avion": pair_avion, "finetune": pair_finetune, "pretrain": pair_pretrain, "self": pair_self}


# ---------------------------------------------------------------------------------------------- loop
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _step(row: Variant, device: str, ranges: bool) -> float:
    """One forward + loss + backward of ``row`` (its checkpointing set first); seconds."""
    rec = record_function if ranges else (lambda _name: contextlib.nullcontext())
    row.setup()
    _sync(device)
    t0 = time.perf_counter()
    with rec("phase:fwd"):
        loss = row.loss()
    with rec("phase:bwd"):
        loss.backward()
    _sync(device)
    dt = time.perf_counter() - t0
    row.model.zero_grad(set_to_none=True)
    return dt


def run_rows(rows: list[Variant], warmup: int, repeats: int, device: str) -> None:
    """Saved bytes once per variant, then warm-up + timed rounds, each round every variant in turn."""
    for row in rows:
        row.setup()
        row.model.train()
        with torch.enable_grad(), SavedTensorTracker(exclude=row.model) as tracker:
            out = row.loss()
        out.backward()
        row.model.zero_grad(set_to_none=True)
        row.saved = tracker.stats.bytes
    for i in range(warmup + repeats):
        for row in rows:
            dt = _step(row, device, ranges=False)
            if i >= warmup:
                row.times.append(dt)


Table = dict[tuple[str, str], tuple[float, float]]  # (phase, op) -> (self ms per step, calls per step)
_MATMUL = ("aten::mm", "aten::addmm", "aten::bmm")


def profile_rows(rows: list[Variant], warmup: int, repeats: int, device: str) -> dict[str, Table]:
    """Warm-up rounds, then ``repeats`` rounds of one profiled step per variant in turn; the mean
    per-op table of each variant's profiled steps."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    tables: dict[str, list[Table]] = {r.name: [] for r in rows}
    for row in rows:
        row.model.train()
    for i in range(warmup + repeats):
        for row in rows:
            if i < warmup:
                _step(row, device, ranges=False)
                continue
            with profile(activities=acts) as prof:
                row.times.append(_step(row, device, ranges=True))
            tables[row.name].append(by_op(prof, 1))
    return {n: mean_tables(t) for n, t in tables.items()}


def compare_ops(a: str, b: str, tables: dict[str, Table], steps: dict[str, list[float]], top: int) -> None:
    """``a`` vs ``b`` by op: the shares side by side, then the ops whose shares differ most, in units of
    each variant's matmul time (``x mm``: op ms / the variant's mm + addmm + bmm ms)."""
    ta, tb = statistics.median(steps[a]), statistics.median(steps[b])
    rounds = f"rounds {[round(t, 2) for t in steps[a]]} vs {[round(t, 2) for t in steps[b]]}"
    print(f"-- {a} vs {b}: median step {ta:.3f} s vs {tb:.3f} s ({ta / tb:.3f}x); {rounds}")
    print_table({a: tables[a], b: tables[b]}, top)
    total = {n: sum(v[0] for v in tables[n].values()) or 1.0 for n in (a, b)}
    mm = {n: sum(v[0] for k, v in tables[n].items() if k[1] in _MATMUL) or 1.0 for n in (a, b)}

    def cell(n: str, k: tuple[str, str]) -> tuple[float, float, float, float]:
        ms, calls = tables[n].get(k, (0.0, 0.0))
        return ms, calls, 100 * ms / total[n], ms / mm[n]

    keys = set(tables[a]) | set(tables[b])
    rows = sorted(keys, key=lambda k: -abs(cell(a, k)[3] - cell(b, k)[3]))[:top]
    print(f"top differing ops (x mm = op time / the variant's matmul time; d = {a} minus {b}):")
    print(f"{'phase':5} {'op':48} {a[:22]:>30} {b[:22]:>30} {'d x mm':>8}")
    for k in rows:
        ca, cb = cell(a, k), cell(b, k)
        cells = "".join(f" {c[0]:8.1f}ms x{c[1]:<4.0f}{c[2]:5.1f}% {c[3]:5.3f}" for c in (ca, cb))
        print(f"{k[0]:5} {k[1][:48]:48}{cells} {ca[3] - cb[3]:+8.3f}")
    ratio = (total[a] / mm[a]) / (total[b] / mm[b])
    print(
        f"op time in matmul units: {a} {total[a] / mm[a]:.3f}, {b} {total[b] / mm[b]:.3f} -> implied step ratio "
        f"{ratio:.3f}x (matmul ms: {mm[a]:.0f} vs {mm[b]:.0f}; all ops: {total[a]:.0f} vs {total[b]:.0f})"
    )


def report(pair: str, rows: list[Variant]) -> dict[str, Any]:
    by = {r.name: r for r in rows}
    med = {r.name: statistics.median(r.times) for r in rows}
    low = {r.name: min(r.times) for r in rows}
    print(f"[{pair}] median and fastest step (s), saved bytes per variant:")
    for r in rows:
        print(
            f"  {r.name:24s} {med[r.name]:8.3f} s {low[r.name]:8.3f} s  {format_bytes(r.saved):>10s}  "
            f"steps {[round(t, 3) for t in r.times]}"
        )
    ref = next((n.split()[0] for n in by if not n.startswith("ours")), None)
    ratios: dict[str, Any] = {}
    pairs = [("off", "off"), ("full", "full"), ("selective", "full")]
    pairs += [("off compiled", "off"), ("full compiled", "full"), ("selective compiled", "full")]
    for ours, theirs in pairs:
        a, b = f"ours {ours}", f"{ref} {theirs}"
        if ref and a in by and b in by:
            ratios[f"{a} / {b}"] = (med[a] / med[b], by[a].saved / by[b].saved, low[a] / low[b])
    for a, b in _patch_dropout_pairs(by, ref):
        ratios[f"{a} / {b}"] = (med[a] / med[b], by[a].saved / by[b].saved, low[a] / low[b])
    for ours in ("full", "selective", "off compiled", "full compiled", "selective compiled"):
        a = f"ours {ours}"
        if a in by and "ours off" in by:
            ratios[f"{a} / ours off"] = (
                med[a] / med["ours off"],
                by[a].saved / by["ours off"].saved,
                low[a] / low["ours off"],
            )
    for k, (t, m, f) in ratios.items():
        print(f"  {k:40s} time {t:.3f}x (fastest steps {f:.3f}x)  saved bytes {m:.3f}x")
    return {"median_s": med, "saved_bytes": {r.name: r.saved for r in rows}, "ratios": ratios}


def _patch_dropout_pairs(by: dict[str, Variant], ref: str | None) -> list[tuple[str, str]]:
    """The patch-dropout rows against the reference's recipe (full checkpointing, no dropout) and against the
    reference with the same dropout (the same work)."""
    out = []
    for name in by:
        if name.startswith("ours full pd="):
            pd = name.split()[-1]
            out += [(name, b) for b in (f"{ref} full", f"{ref} full {pd}", "ours full") if ref and b in by]
    return out


def profile_report(rows: list[Variant], tables: dict[str, Table], top: int) -> None:
    """Each of ours against the reference at the same checkpointing (selective against ``full``)."""
    steps = {r.name: r.times for r in rows}
    ref = next((n.split()[0] for n in steps if not n.startswith("ours")), None)
    for ours, theirs in (("off", "off"), ("full", "full"), ("selective", "full")):
        a, b = f"ours {ours}", f"{ref} {theirs}"
        if a in tables and b in tables:
            compare_ops(a, b, tables, steps, top)


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default="avion,finetune,pretrain,self")
    p.add_argument("--avion-src", default=None, help="a clone of github.com/zhaoyue-zephyrus/AVION")
    p.add_argument(
        "--patch-dropout",
        type=float,
        default=0.0,
        help="avion pair: two more rows, ours and AVION's with this patch dropout (FLIP) and full checkpointing",
    )
    p.add_argument("--frames", type=int, default=None, help="default: 4 for avion, 16 otherwise")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=None, help="default: 4 for avion, 1 otherwise")
    p.add_argument("--self-model", default="vit_base_patch16_224")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager", "flash"))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="also ours with compiled blocks (torch.compile)")
    p.add_argument("--profile", action="store_true", help="per-op profile of each variant instead of timing")
    p.add_argument("--variants", default=None, help="only these checkpointing settings, e.g. off,full")
    p.add_argument("--top", type=int, default=20, help="--profile: rows per table")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=PRECISIONS, help="default: bf16 on CUDA, fp32 on CPU")
    args = p.parse_args(argv)
    if args.warmup < 2:
        p.error("--warmup: at least 2 (one warm-up step is not enough on CPU)")
    dtype = torch_dtype(args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32"))
    machine = (
        torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine()
    )
    print(f"torch {torch.__version__}, {machine}, {str(dtype)[6:]}, warm-up {args.warmup}, repeats {args.repeats}")
    for pair in args.pairs.split(","):
        a = copy.copy(args)
        a.frames = args.frames or (4 if pair == "avion" else 16)
        a.batch = args.batch or (4 if pair == "avion" else 1)
        print(f"== {pair}: {a.frames} x {a.size}, batch {a.batch}; load average {_load()}")
        with contextlib.ExitStack():
            rows = PAIRS[pair](a, args.device, dtype)
            if args.variants:
                rows = [r for r in rows if r.name.split(" ", 1)[1] in args.variants.split(",")]
            if args.profile:
                profile_report(rows, profile_rows(rows, args.warmup, args.repeats, args.device), args.top)
            else:
                run_rows(rows, args.warmup, args.repeats, args.device)
                report(pair, rows)
        print(
            f"== {pair} done; load average {_load()} (other processes on the CPUs slow every variant alike: rounds alternate)"
        )
        del rows
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a checkpoint policy's time goes: one training step profiled by op, per policy.

Policies: ``none`` / ``full`` / ``selective`` (a subset with ``--policies``). ``--warmup`` rounds, then
``--repeats`` rounds; every round runs one step of each policy in turn (A/B alternating, so a load
that changes over the run slows every policy alike), each step under ``torch.profiler`` (CPU
activities, plus CUDA on a GPU). Every op's self time is split by phase: ``fwd`` (inside the loss
closure) or ``bwd`` (inside ``backward()``: gradient kernels AND the forward ops a checkpoint
recomputes). The table lists, per (phase, op), the self time per step and the calls per step under
each policy and the difference against the first policy; calls count dispatches (the op a selective
checkpoint's dispatch mode re-enters counts once; an op it returns from its cache counts too, at ~0
ms). The footer gives each policy's median step time, saved bytes (``SavedTensorTracker``) and the
ratios to the first policy.

``--extra-save OPS`` (comma separated: ``proj``, ``fc1``, ``norm``) tries a wider selective op set
without editing the package: the named outputs are also kept (``MUST_SAVE``) on top of
``selective_policy``; its rows are labelled ``selective+OPS``.

    python bench/checkpoint_profile.py --frames 8 --batch 1                # ViT-B 8x224, CPU: ~3 min
    python bench/checkpoint_profile.py --frames 16 --extra-save proj       # also keep the output projection
    python bench/checkpoint_profile.py --device cuda --dtype bf16 --frames 16 --batch 8
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from avion_ds.distributed.ds_config import PRECISIONS, torch_dtype
from avion_ds.memory.activations import SavedTensorTracker
from avion_ds.memory.units import format_bytes
from avion_ds.models import activation_checkpointing as ac
from avion_ds.models import apply_activation_checkpointing, create_model, remove_activation_checkpointing

_MM = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
_NORM = (torch.ops.aten.native_layer_norm.default,)


def _extra_policy(extra: set[str]) -> Callable[..., CheckpointPolicy]:
    """``selective_policy`` that also keeps the output projection (square matmul), fc1 (D -> F) or
    the layer norms' outputs."""

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in _MM and args[-1].dim() == 2:
            rows, cols = args[-1].shape  # w^T: (in, out)
            if ("proj" in extra and rows == cols) or ("fc1" in extra and cols > rows and cols != 3 * rows):
                return CheckpointPolicy.MUST_SAVE
        if "norm" in extra and op in _NORM:
            return CheckpointPolicy.MUST_SAVE
        return ac.selective_policy(ctx, op, *args, **kwargs)

    return policy


@contextmanager
def policy_in_effect(name: str) -> Iterator[None]:
    """Run with ``selective+OPS``'s op set in place of the package's selective one (restored after)."""
    original = ac._selective_contexts
    if "+" in name:
        pol = _extra_policy(set(name.split("+", 1)[1].split("+")))
        ac._selective_contexts = lambda: create_selective_checkpoint_contexts(pol)  # type: ignore[assignment]
    try:
        yield
    finally:
        ac._selective_contexts = original  # type: ignore[assignment]


def _setup(model: torch.nn.Module, name: str) -> None:
    if name == "none":
        remove_activation_checkpointing(model)
    else:
        apply_activation_checkpointing(model, policy="full" if name == "full" else "selective")


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    with record_function("phase:fwd"):
        loss = F.cross_entropy(model(x).float(), y)
    with record_function("phase:bwd"):
        loss.backward()
    model.zero_grad(set_to_none=True)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def by_op(prof: Any, steps: int) -> dict[tuple[str, str], tuple[float, float]]:
    """{(phase, op): (self ms per step, calls per step)} of the aten ops, phase from the enclosing range."""
    events = list(prof.events())
    spans = {
        ph: [(e.time_range.start, e.time_range.end) for e in events if e.name == f"phase:{ph}"] for ph in ("fwd", "bwd")
    }
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        start = e.time_range.start
        phase = next((ph for ph, sp in spans.items() if any(a <= start <= b for a, b in sp)), "other")
        self_us = e.self_cpu_time_total + getattr(e, "self_device_time_total", 0)
        out[(phase, e.name)][0] += self_us / 1e3 / steps
        parent = e.cpu_parent  # selective checkpointing: aten::op -> PythonDispatchMode -> aten::op, count once
        out[(phase, e.name)][1] += 0 if parent is not None and parent.name == "PythonDispatchMode" else 1 / steps
    return {k: (v[0], v[1]) for k, v in out.items()}


def mean_tables(
    tables: list[dict[tuple[str, str], tuple[float, float]]],
) -> dict[tuple[str, str], tuple[float, float]]:
    keys = {k for t in tables for k in t}
    return {k: tuple(sum(t.get(k, (0.0, 0.0))[j] for t in tables) / len(tables) for j in (0, 1)) for k in keys}  # type: ignore[misc]


def print_table(tables: dict[str, dict[tuple[str, str], tuple[float, float]]], top: int) -> None:
    """Per (phase, op): ms/step, calls/step and share of the policy's op time, per policy; and each
    policy's share minus the first policy's (points), which a load that changes between steps does
    not skew the way absolute ms do."""
    names = list(tables)
    total = {n: sum(v[0] for v in t.values()) or 1.0 for n, t in tables.items()}

    def share(n: str, k: tuple[str, str]) -> float:
        return 100 * tables[n].get(k, (0.0, 0.0))[0] / total[n]

    keys = {k for t in tables.values() for k in t}
    rows = sorted(keys, key=lambda k: -max(share(n, k) for n in names))[:top]
    head = f"{'phase':5} {'op':58}" + "".join(f" {n[:24]:>24}" for n in names)
    head += "".join(f" {'d% ' + n[:14]:>17}" for n in names[1:])
    print(f"{head}\n{'-' * len(head)}")
    print(f"(ms/step x calls/step [% of the policy's op time]; d% = share minus {names[0]}'s share, points)")
    for k in rows:
        cells = "".join(
            f" {tables[n].get(k, (0, 0))[0]:9.1f}x{tables[n].get(k, (0, 0))[1]:<5.0f}[{share(n, k):5.1f}%]"
            for n in names
        )
        diffs = "".join(f" {share(n, k) - share(names[0], k):+17.1f}" for n in names[1:])
        print(f"{k[0]:5} {k[1][:58]:58}{cells}{diffs}")
    for ph in ("fwd", "bwd"):
        tot = "".join(f" {sum(v[0] for k, v in tables[n].items() if k[0] == ph):24.1f}" for n in names)
        print(f"{ph:5} {'(all aten ops, ms/step)':58}{tot}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--policies", default="none,full,selective")
    p.add_argument("--extra-save", default="", help="also a selective variant keeping these: proj,fc1,norm")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="A/B rounds, profiled and timed")
    p.add_argument("--top", type=int, default=24)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=PRECISIONS, help="default: bf16 on CUDA, fp32 on CPU")
    args = p.parse_args(argv)
    dtype = torch_dtype(args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32"))
    names = args.policies.split(",") + ([f"selective+{args.extra_save.replace(',', '+')}"] if args.extra_save else [])
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {torch.get_num_threads()}, "
        f"{args.model} {args.frames}x{args.size}, batch {args.batch}, {str(dtype)[6:]}"
    )
    torch.manual_seed(0)
    model = create_model(args.model, num_frames=args.frames, img_size=args.size, drop_path_rate=0.1)
    model = model.to(args.device, dtype).train()
    x = torch.randn(args.batch, 3, args.frames, args.size, args.size, device=args.device, dtype=dtype)
    classes = model.head.out_features if hasattr(model.head, "out_features") else 400
    y = torch.randint(0, classes, (args.batch,), device=args.device)
    saved, times, events = {}, defaultdict(list), defaultdict(list)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    for i in range(args.warmup + args.repeats):
        for n in names:
            _setup(model, n)
            with policy_in_effect(n):
                if i == 0:
                    with torch.enable_grad(), SavedTensorTracker(exclude=model) as tr:
                        out = model(x)
                    saved[n] = tr.stats.bytes
                    del out
                if i < args.warmup:
                    _step(model, x, y)
                    continue
                with profile(activities=acts) as prof:
                    _sync(args.device)
                    t0 = time.perf_counter()
                    _step(model, x, y)
                    _sync(args.device)
                    times[n].append(time.perf_counter() - t0)
            events[n].append(by_op(prof, 1))
    tables = {n: mean_tables(events[n]) for n in names}
    print_table(tables, args.top)
    med = {n: statistics.median(times[n]) for n in names}
    for n in names:
        print(
            f"{n:24s} step {med[n]:7.3f} s ({med[n] / med[names[0]]:.3f}x)  saved {format_bytes(saved[n]):>10s} "
            f"({saved[n] / saved[names[0]]:.3f}x)  rounds {[round(t, 3) for t in times[n]]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

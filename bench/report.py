"""Turn bench JSON results (bench/memory.py, bench/peer.py, bench/gpu_suite.sh) into one PNG chart.

  python bench/report.py out/*.json --out out/suite.png [--merged out/suite.json]

Each JSON may hold any of the sections ratio, activations, throughput, capacity, giant, offload, peer;
one panel is drawn per section present (missing sections are skipped, not faked).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MiB = 2**20


def _short(name: str) -> str:
    return name.replace("vit_", "").replace("_patch16_224", "").replace("_patch14_224", "")


def merge(paths: list[Path]) -> dict[str, Any]:
    """Merge the sections of several result files (later files win on the same section)."""
    merged: dict[str, Any] = {}
    for p in paths:
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"bench/report.py: skipping {p}: {e}", file=sys.stderr)
            continue
        for key, value in data.items():
            if key in ("machine", "command", "seconds"):
                merged.setdefault(key + "s", {})[p.name] = value
            else:
                merged[key] = value
    return merged


def _panel_ratio(ax, d):
    ax.bar(["no ckpt", "ckpt every block"], [d["bytes_no_ckpt"] / MiB, d["bytes_ckpt"] / MiB], color=["C0", "C2"])
    ax.set_title(f"ViT-B {d['frames']}x{d['size']} activations/clip ({d['ratio']:.2f}x)")
    ax.set_ylabel("MiB")


def _panel_activations(ax, rows):
    labels = [f"{_short(r['model'])}{'+ck' if r['checkpointing'] else ''}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["measured"] / MiB for r in rows], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r["predicted"] / MiB for r in rows], 0.4, label="predicted")
    ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
    ax.set_ylabel("MiB / clip")
    ax.set_title(f"activations, predicted vs measured (depth {rows[0]['depth']})")
    ax.legend(fontsize=7)


def _panel_throughput(ax, rows):
    ok = [r for r in rows if r.get("clips_per_s")]
    labels = [f"{_short(r['model'])}\n{r['attn_backend']}" for r in ok]
    bars = ax.bar(
        labels, [r["clips_per_s"] for r in ok], color=["C1" if r["attn_backend"] == "flash" else "C0" for r in ok]
    )
    for b, r in zip(bars, ok):
        if r.get("mfu"):
            ax.annotate(
                f"MFU {r['mfu']:.0%}",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_ylabel("train clips/s")
    ax.set_title("bf16 16x224 train step: flash vs sdpa")


def _panel_capacity(ax, cap):
    rows = cap.get("max_micro", [])
    labels = [f"{_short(r['model'])}{'+ck' if r['checkpoint_every'] else ''}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["predicted"] for r in rows], 0.4, label="planner")
    ax.bar([x + 0.2 for x in xs], [r["measured"] for r in rows], 0.4, label="measured")
    ax.set_xticks(list(xs), labels, rotation=45, fontsize=7)
    ax.set_ylabel("largest micro-batch")
    errs = [p["planner_error"] for p in cap.get("probes", []) if "planner_error" in p]
    extra = f"; peak error max {max(abs(e) for e in errs):.0%}" if errs else ""
    ax.set_title(f"under {cap['cap'] / 2**30:.0f} GiB{extra}")
    ax.legend(fontsize=7)


def _panel_giant(ax, rows):
    ok = [r for r in rows if r.get("peak_allocated")]
    labels = [f"micro {r['micro_batch']}" for r in ok]
    xs = range(len(ok))
    ax.bar([x - 0.2 for x in xs], [r["peak_allocated"] / 2**30 for r in ok], 0.4, label="measured peak")
    ax.bar([x + 0.2 for x in xs], [r["predicted_allocated"] / 2**30 for r in ok], 0.4, label="predicted")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("GiB")
    ax.set_title("ViT-g ZeRO-3 offload + ckpt")
    ax.legend(fontsize=7)


def _panel_peer(ax, p):
    t, a = p["throughput"], p["activations"]
    ax.bar(["clips/s\nours", "clips/s\nHF"], [t["clips_per_s"]["ours"], t["clips_per_s"]["hf"]], color=["C2", "C7"])
    ax2 = ax.twinx()
    ax2.bar(["act MiB\nours", "act MiB\nHF"], [a["ours"] / MiB, a["hf"] / MiB], color=["C2", "C7"], alpha=0.5)
    ax.set_ylabel("train clips/s (solid)")
    ax2.set_ylabel(f"activation MiB/clip {a['frames']}x{a['size']} (light)")
    ax.set_title(f"vs HF VideoMAE: {t['speedup']:.2f}x speed, {a['ratio']:.2f}x act. memory")


def _panel_offload(ax, rows):
    labels = ["plain" if r["mode"] == "plain" else f"live {r['max_live_parameters'] / 1e6:g}M" for r in rows]
    ax.bar(labels, [r["clips_per_s"] for r in rows], color=["C0"] + ["C3"] * (len(rows) - 1))
    ax.set_ylabel("eval clips/s")
    if all(r.get("peak_allocated") for r in rows):
        ax2 = ax.twinx()
        ax2.plot(labels, [r["peak_allocated"] / 2**30 for r in rows], "k.-")
        ax2.set_ylabel("peak GiB (dots)")
    ax.set_title(f"{_short(rows[0]['model'])} layer-streaming eval (ZeRO-3 offload)")


PANELS = {
    "ratio": _panel_ratio,
    "activations": _panel_activations,
    "throughput": _panel_throughput,
    "capacity": _panel_capacity,
    "giant": _panel_giant,
    "offload": _panel_offload,
    "peer": _panel_peer,
}


def render(merged: dict[str, Any], out: Path) -> list[str]:
    """Draw one panel per section present; return the sections drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in PANELS if merged.get(k)]
    if not present:
        raise ValueError(
            "no known sections (ratio, activations, throughput, capacity, giant, offload, peer) in the inputs"
        )
    cols = min(3, len(present))
    rows = (len(present) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, present):
        PANELS[key](ax, merged[key])
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return present


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    p.add_argument("--merged", type=Path, default=None, help="also write the merged JSON here")
    args = p.parse_args(argv)
    merged = merge(args.inputs)
    try:
        drawn = render(merged, args.out)
    except ValueError as e:
        print(f"bench/report.py: {e}", file=sys.stderr)
        return 2
    if args.merged:
        args.merged.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"wrote {args.out} ({', '.join(drawn)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`avion-ds` command line: one entry, subcommands dispatched lazily to their owning modules.

Each subcommand module exposes ``main(argv: list[str] | None) -> int`` so that heavy imports
(torch, deepspeed, decoders) happen only for the command actually run.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "chunk": ("avion_ds.data.chunking", "re-encode long videos into short chunks + manifest.jsonl"),
    "synth": ("avion_ds.data.synthetic", "generate a small learnable EPIC-style synthetic dataset"),
    "train": ("avion_ds.engine.train", "train / fine-tune from a YAML recipe (also under deepspeed)"),
    "eval": ("avion_ds.engine.evaluate", "evaluate a checkpoint; writes metrics JSON"),
    "export": ("avion_ds.engine.export", "consolidate ZeRO shards into one fp32 safetensors file"),
    "reconstruct": ("avion_ds.engine.reconstruct", "pretraining run: original / masked / reconstructed frames as one PNG"),
    "plan": ("avion_ds.memory.plan", "pick ZeRO stage / offload / checkpointing / micro-batch for a GPU budget"),
}


def _usage() -> str:
    lines = ["usage: avion-ds <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``avion-ds <command> ...`` to ``<module>.main(rest)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"avion-ds: unknown command {cmd!r}\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

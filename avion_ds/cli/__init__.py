"""`avion-ds` command line: one entry, subcommands dispatched lazily to their owning modules.

Each subcommand module exposes ``main(argv: list[str] | None) -> int`` so that heavy imports
(torch, deepspeed, decoders) happen only for the command actually run.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

import avion_ds

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "chunk": ("avion_ds.cli.chunk", "re-encode long videos into short chunks + manifest.jsonl"),
    "pack": ("avion_ds.cli.pack", "pack a chunk tree into litdata shards (no re-encoding)"),
    "check": ("avion_ds.cli.check", "integrity pass over a prepared dataset; writes quarantine.tsv"),
    "synth": ("avion_ds.cli.synth", "generate a small learnable EPIC-style synthetic dataset"),
    "train": ("avion_ds.cli.train", "train / fine-tune from a YAML recipe (also under deepspeed)"),
    "eval": ("avion_ds.cli.eval", "evaluate a checkpoint; writes metrics JSON"),
    "export": ("avion_ds.cli.export", "consolidate ZeRO shards into one fp32 safetensors file"),
    "reconstruct": (
        "avion_ds.cli.reconstruct",
        "pretraining run: original / masked / reconstructed frames as one PNG",
    ),
    "plan": ("avion_ds.cli.plan", "pick ZeRO stage / offload / checkpointing / micro-batch for a GPU budget"),
    "bench-loader": ("avion_ds.cli.bench_loader", "clips/s per DataLoader worker and workers needed per GPU"),
    "models": ("avion_ds.cli.models", "registered model sizes with parameters and GFLOPs per clip"),
    "embed": ("avion_ds.cli.embed", "video embeddings of fixed-length clips (an index), or text embeddings"),
    "search": ("avion_ds.cli.search", "top-k clips of an embedding index for a text query (table, --html)"),
}
# subcommand -> (light module, parse function): parsed before the command's module (torch, DeepSpeed,
# models) is imported, so --help and usage errors answer at once
PARSE_FIRST: dict[str, tuple[str, str]] = {
    "train": ("avion_ds.cli.parsers", "train_args"),
    "eval": ("avion_ds.cli.parsers", "eval_args"),
    "models": ("avion_ds.cli.parsers", "models_args"),
}
# distribution name -> how --version shows it (read from package metadata: nothing heavy is imported)
_PACKAGES = {
    "torch": "torch",
    "deepspeed": "deepspeed",
    "flash-attn": "flash-attn",
    "decord": "decord",
    "torchcodec": "torchcodec",
    "av": "PyAV",
    "transformers": "transformers",
}
EXIT_CODES = "exit codes: 0 done, 1 failure (traceback), 2 bad input (one line), 3 non-finite stop (train)"


def _usage() -> str:
    lines = ["usage: avion-ds <command> [options]   (avion-ds --version, avion-ds <command> --help)", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join([*lines, "", EXIT_CODES])


def versions() -> dict[str, str]:
    """avion_ds and the libraries it runs on: version, or 'not installed'; plus the CUDA torch sees."""
    from importlib import metadata  # lazy: only --version reads package metadata (email, csv: ~30 ms)

    out = {"avion_ds": avion_ds.__version__}
    for dist, shown in _PACKAGES.items():
        try:
            out[shown] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[shown] = "not installed"
    import torch  # lazy: torch takes seconds to import; only --version asks it

    built = torch.version.cuda or "none (CPU build)"
    out["CUDA"] = f"{built} (torch build); " + (
        f"{torch.cuda.device_count()} GPU(s) visible" if torch.cuda.is_available() else "no GPU visible"
    )
    return out


def launcher_rank(argv: list[str]) -> list[str]:
    """``argv`` without the ``--local_rank=N`` (``--local_rank N``, ``--local-rank``) the deepspeed launcher
    puts before the subcommand of ``--module avion_ds.cli``; N goes to ``LOCAL_RANK`` where unset."""
    while argv and argv[0].split("=")[0] in ("--local_rank", "--local-rank"):
        flag = argv.pop(0)
        value = flag.partition("=")[2] if "=" in flag else (argv.pop(0) if argv else "")
        if value:
            os.environ.setdefault("LOCAL_RANK", value)
    return argv


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``avion-ds <command> ...`` to ``<module>.main(rest)`` (``argv`` None: this process's command
    line, whose imports are then frozen: :func:`freeze_imports`)."""
    argv_given = argv
    argv = launcher_rank(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print("\n".join(f"{k:<13} {v}" for k, v in versions().items()))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"avion-ds: unknown command {cmd!r}\n{_usage()}", file=sys.stderr)
        return 2
    if cmd in PARSE_FIRST:
        light, parse = PARSE_FIRST[cmd]
        getattr(importlib.import_module(light), parse)(list(rest))  # --help / a usage error exits here
    module = importlib.import_module(COMMANDS[cmd][0])
    if argv_given is None:  # this process's own command line: its imports are done
        freeze_imports()
    return int(module.main(rest) or 0)


def freeze_imports() -> None:
    """Hand every object alive now, after a command's imports (~0.5M in a training rank: torch, timm,
    DeepSpeed), to the collector's permanent generation: later full collections (the automatic ones,
    ``dist.shutdown``'s, a forked DataLoader worker's, which would also copy those pages) skip them: a full
    pass over them costs ~0.26 s of CPU on a 2-core VM. Only for a command's own process (``launch/train.py``,
    the ``avion-ds`` script): what is garbage at this point is never collected, which after imports is next to
    nothing, but in a caller's process (a test calling ``main(argv)``) may be a model.
    ``AVION_DS_GC_FREEZE=0`` leaves the collector alone (to measure: ``bench/startup.py``)."""
    if os.environ.get("AVION_DS_GC_FREEZE", "1") != "0":
        gc.freeze()

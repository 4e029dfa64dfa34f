"""The structure walk: which avion_ds modules a reader passes through, in order, from ``avion-ds train``'s entry
through start-up (recipe, checks, DeepSpeed plan, datasets) to the model summary, i.e. ``train --dry-run``.

The current module is traced with ``sys.setprofile`` (a call into an avion_ds function enters its module, a
return goes back to the caller's), each call edge (caller -> callee code) once, as a reader follows it: a repeat
of an edge (a loop over rows or batches) and everything under it are not walked again. Consecutive events in
one module are one *stay*; a stay in a module the walk has already been in is a *return*: how often a reader of
the start-up goes back to a file. Fewer returns = seams that hand over once. Modules are imported before the
walk, so only run-time calls count.

The recipe walk follows the recipe itself: only the functions that take the recipe or one of its sections as
an argument are stays (each call edge once), and a return goes back to the module of the nearest such caller:
the hand-overs a reader follows to see where the recipe is checked and used. The field walk follows one
recipe key instead: the modules whose code reads ``data.<--field>`` (default
``num_frames``), each reading line once, in the order start-up reads it.

    python bench/structure_walk.py                      # tiny synthetic EPIC data, the demo recipe
    python bench/structure_walk.py --top 10 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def make_data(out: Path) -> list[str]:
    """Two small synthetic EPIC-style videos, chunked; the ``--set`` overrides that point the demo recipe at them."""
    from avion_ds.cli.chunk import main as chunk
    from avion_ds.cli.synth import main as synth

    with contextlib.redirect_stdout(io.StringIO()):
        synth([str(out / "synth"), "--num-videos", "2", "--segments-per-video", "16", "--seed", "0"])
        chunk([str(out / "synth" / "videos"), str(out / "chunks"), "--chunk-seconds", "15", "--no-progress"])
    return [
        f"data.root={out / 'chunks'}",
        f"data.train_csv={out / 'synth' / 'train.csv'}",
        f"data.val_csv={out / 'synth' / 'val.csv'}",
        f"output_dir={out / 'run'}",
    ]


def _dry_run(argv: list[str], profiler: Any = None) -> None:
    """``avion-ds train ARGV --dry-run``'s start-up, its output swallowed, under ``sys.setprofile(profiler)``."""
    import avion_ds.cli.train as train_cli

    sys.setprofile(profiler)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            train_cli.setup_run(train_cli.parse_args([*argv, "--dry-run"]))
    finally:
        sys.setprofile(None)


def walk(argv: list[str]) -> list[str]:
    """The module of each stay while ``avion-ds train ARGV --dry-run`` runs (avion_ds modules only)."""

    stays: list[str] = []
    edges: set[tuple[object, object]] = set()
    counted: list[bool] = []  # per live frame since the walk began: is its call part of the walk?

    def enter(module: str) -> None:
        if module.startswith("avion_ds.") and (not stays or stays[-1] != module):
            stays.append(module)

    def track(frame, event: str, _arg) -> None:
        if event == "call":  # a call edge read once: its repeats (loops over rows, batches) are not walked again
            caller = frame.f_back.f_code if frame.f_back is not None else None
            new = (caller, frame.f_code) not in edges and (not counted or counted[-1])
            edges.add((caller, frame.f_code))
            counted.append(new)
            if new:
                enter(frame.f_globals.get("__name__", ""))
        elif event == "return" and counted and counted.pop() and frame.f_back is not None:
            enter(frame.f_back.f_globals.get("__name__", ""))

    _dry_run(argv, track)
    return stays


def _carriers(recipe: object) -> set[int]:
    """The ids of a recipe and of its sections (core fields and registered ones): what the recipe walk follows."""
    import dataclasses

    ids = {id(recipe)}
    for f in dataclasses.fields(recipe):
        value = getattr(recipe, f.name)
        values = value.values() if isinstance(value, dict) else [value]
        ids.update(id(v) for v in values if dataclasses.is_dataclass(v))
    return ids


def recipe_walk(argv: list[str]) -> list[str]:
    """The module of each stay of the functions that take the recipe or one of its sections as an argument
    (each call edge once), from the recipe's first hand-over to the model summary: the modules the recipe is
    carried through while ``avion-ds train ARGV --dry-run`` runs. A call's return goes back to the module of the
    nearest caller on the walk. Attribute plumbing on the recipe itself (dunder methods) is not a hop."""
    from avion_ds.config.recipe import Recipe

    stays: list[str] = []
    edges: set[tuple[object, object]] = set()
    carriers: set[int] = set()
    stack: list[str | None] = []  # per live frame: its module when its call is on the walk, else None

    def enter(module: str) -> None:
        if not stays or stays[-1] != module:
            stays.append(module)

    def on_walk(frame) -> bool:
        code = frame.f_code
        if code.co_name.startswith("__") or not frame.f_globals.get("__name__", "").startswith("avion_ds."):
            return False
        n = code.co_argcount + code.co_kwonlyargcount
        args = [frame.f_locals.get(name) for name in code.co_varnames[:n]]
        for value in args:
            if isinstance(value, Recipe) and id(value) not in carriers:
                carriers.update(_carriers(value))
        return any(id(v) in carriers for v in args)

    def track(frame, event: str, _arg) -> None:
        if event == "call":
            caller = frame.f_back.f_code if frame.f_back is not None else None
            edge = (caller, frame.f_code)
            module = frame.f_globals.get("__name__", "") if edge not in edges and on_walk(frame) else None
            if module is not None:
                edges.add(edge)
                enter(module)
            stack.append(module)
        elif event == "return" and stack and stack.pop() is not None:
            back = next((m for m in reversed(stack) if m is not None), None)
            if back is not None:
                enter(back)

    _dry_run(argv, track)
    return stays


def field_walk(argv: list[str], field: str) -> list[str]:
    """The module of each stay of the places that read ``data.<field>`` (each reading line once) while
    ``avion-ds train ARGV --dry-run`` runs: the walk a reader follows to see what one recipe key does."""
    from avion_ds.config import DataConfig

    stays: list[str] = []
    lines: set[tuple[object, int]] = set()
    plain = DataConfig.__getattribute__

    def reading(self: DataConfig, name: str) -> object:
        if name == field:
            caller = sys._getframe(1)
            module = caller.f_globals.get("__name__", "")
            if (caller.f_code, caller.f_lineno) not in lines and module.startswith("avion_ds."):
                lines.add((caller.f_code, caller.f_lineno))
                if not stays or stays[-1] != module:
                    stays.append(module)
        return plain(self, name)

    DataConfig.__getattribute__ = reading
    try:
        _dry_run(argv)
    finally:
        DataConfig.__getattribute__ = plain
    return stays


def summary(stays: list[str]) -> dict:
    """Stays, returns (stays in a module visited before) and the modules returned to most."""
    seen: set[str] = set()
    returns: Counter[str] = Counter()
    for module in stays:
        if module in seen:
            returns[module] += 1
        seen.add(module)
    return {"stays": len(stays), "returns": sum(returns.values()), "modules": len(seen), "by_module": returns}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "launch" / "recipes" / "demo_cpu.yaml"))
    ap.add_argument("--deepspeed-config", default=str(REPO / "ds_configs" / "zero2.json"))
    ap.add_argument("--set", action="append", default=[], help="recipe overrides (default: generated tiny data)")
    ap.add_argument("--top", type=int, default=8, help="modules returned to most")
    ap.add_argument("--json", help="write the summary and the walk here")
    ap.add_argument("--field", default="num_frames", help="the data.* key whose readers make the field walk")
    args = ap.parse_args()
    import avion_ds.cli.train
    import avion_ds.data.datasets.build
    import avion_ds.tasks  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        sets = args.set or make_data(Path(tmp))
        argv = ["--config", args.config, "--deepspeed_config", args.deepspeed_config]
        argv += [x for s in sets for x in ("--set", s)]
        stays, carried, readers = walk(argv), recipe_walk(argv), field_walk(argv, args.field)
    result, recipe, field = summary(stays), summary(carried), summary(readers)
    for name, res in (("start-up walk", result), ("recipe walk", recipe)):
        print(f"{name}: {res['stays']} stays in {res['modules']} modules, {res['returns']} returns")
        for module, n in res["by_module"].most_common(args.top):
            print(f"  {n:4d} returns to {module}")
    print(
        f"data.{args.field} readers: {field['stays']} stays in {field['modules']} modules, {field['returns']} returns"
    )
    print("  " + " > ".join(m.removeprefix("avion_ds.") for m in readers))
    if args.json:
        out = {**result, "by_module": dict(result["by_module"]), "walk": stays}
        out["recipe"] = {**recipe, "by_module": dict(recipe["by_module"]), "walk": carried}
        out["field"] = {**field, "by_module": dict(field["by_module"]), "walk": readers}
        Path(args.json).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

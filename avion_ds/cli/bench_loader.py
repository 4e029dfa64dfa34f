"""`avion-ds bench-loader RECIPE`: how many DataLoader workers a GPU needs, measured on this machine
(the measurement: :mod:`avion_ds.data.decode.loader_bench`)."""

from __future__ import annotations

import os
import sys

import torch

from avion_ds.cli.args import Parser, add_positional_alias, alias_positional
from avion_ds.cli.plugins import add_plugin_option, import_plugins
from avion_ds.config import ConfigError, add_override_option
from avion_ds.data.decode.loader_bench import clips_per_s_loader, clips_per_s_main, workers_needed
from avion_ds.data.decode.select import pick_decoder
from avion_ds.tasks import load_recipe


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="avion-ds bench-loader", description=__doc__.splitlines()[0])
    p.add_argument("--config", dest="recipe", default=None, help="YAML recipe (its data section is measured)")
    add_positional_alias(p, "--config", "recipe")
    add_override_option(p)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    p.add_argument("--batch", type=int, default=4, help="batch size for the DataLoader rows (default 4)")
    p.add_argument("--batches", type=int, default=10, help="timed batches per worker count (default 10)")
    p.add_argument("--clips", type=int, default=20, help="timed clips in the main process (default 20)")
    p.add_argument("--target", type=float, default=None, help="clips/s one GPU consumes; prints workers needed")
    add_plugin_option(p)
    a = p.parse_args(argv)
    alias_positional(a, "--config", "recipe", "avion-ds bench-loader")
    try:
        workers = [int(w) for w in a.workers.split(",") if w.strip()]
        if not workers or min(workers) < 1:
            raise ValueError
    except ValueError:
        print(
            f"avion-ds bench-loader: error: --workers {a.workers!r}: give positive integers like 1,2", file=sys.stderr
        )
        return 2
    try:
        import_plugins(a.plugins)
        recipe = load_recipe(a.recipe, a.overrides)
        for key in ("root", "train_csv"):
            if not getattr(recipe.data, key) or not os.path.exists(getattr(recipe.data, key)):
                raise ConfigError(f"data.{key}: not found: {getattr(recipe.data, key)!r}")
    except ConfigError as e:
        print(f"avion-ds bench-loader: error: {e}", file=sys.stderr)
        return 2
    from avion_ds.data.datasets.build import build_dataset  # lazy: the dataset modules (~35 ms) load after parsing

    torch.set_num_threads(1)
    name, why = pick_decoder(recipe.data)
    recipe.data.decoder = name
    ds = build_dataset(recipe.data, "train", seed=recipe.seed, sections=recipe.sections)
    d = recipe.data
    print(
        f"{why}\ndataset: {d.dataset} {len(ds)} clips, {d.num_frames}x{d.size}px, decode_timeout_s={d.decode_timeout_s:g}, "
        f"{os.cpu_count()} CPUs"
    )
    main_rate = clips_per_s_main(ds, a.clips)
    print(f"{'workers':>8} {'clips/s':>9} {'per worker':>11}")
    print(f"{'main':>8} {main_rate:9.2f} {main_rate:11.2f}")
    per_worker = main_rate
    for w in workers:
        rate = clips_per_s_loader(ds, w, a.batch, a.batches, recipe.seed)
        per_worker = rate / w
        print(f"{w:>8} {rate:9.2f} {per_worker:11.2f}")
    if a.target:
        n = workers_needed(a.target, per_worker)
        print(
            f"target {a.target:g} clips/s per GPU -> {n} workers (ceil({a.target:g} / {per_worker:.2f} clips/s per "
            f"worker at {workers[-1]} workers); needs {n} free cores per GPU"
        )
    else:
        print("workers per GPU = ceil(target clips/s / clips/s per worker); pass --target to compute it")
    if ds.errors:
        print(f"note: {ds.errors} bad samples were skipped while measuring (named in the log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

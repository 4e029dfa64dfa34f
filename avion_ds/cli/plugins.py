"""``--plugin MODULE``: import a module of another package before the recipe is read, so the tasks,
recipe sections (and datasets) it registers exist for the run, with no file of avion_ds edited.

Only the person running the command names plugins: never a recipe, a run directory or an index (a
plugin is code, and a recipe or run directory may come from someone else). Task and dataset plugins come
from this command line; decoder backends also from ``$AVION_DS_DECODER_PLUGINS`` (``data.decode.base``),
the same person's own environment, which decode helper processes and loader workers inherit. Every command that reads a
recipe imports them first thing, on every rank: ``avion-ds train``, ``launch/train.py``, ``avion-ds eval``,
``export`` (``--format hf`` reads the run's recipe), ``check``, ``bench-loader``, ``reconstruct``, ``embed``
and ``search``.
"""

from __future__ import annotations

import argparse
import importlib
import keyword
from collections.abc import Sequence
from types import ModuleType

from avion_ds.config import ConfigError


def add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """The repeatable ``--plugin MODULE`` option (collected in ``args.plugins``)."""
    parser.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this Python module before reading the recipe (repeatable): a task, recipe section or "
        "dataset of another package registers itself; the module must be installed or on PYTHONPATH",
    )


def _is_module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() and not keyword.iskeyword(part) for part in name.split("."))


def import_plugins(names: Sequence[str]) -> list[ModuleType]:
    """Import each ``--plugin`` module in order; ConfigError (one line) for a name that is not a module
    name, a module that is not found, or an import that fails for want of a module or name."""
    modules = []
    for name in names:
        if not _is_module_name(name):
            raise ConfigError(
                f"--plugin {name!r}: not a Python module name (dotted identifiers, e.g. my_package.tasks)"
            )
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise ConfigError(
                    f"--plugin {name}: no module named {e.name!r} (install its package or put it on PYTHONPATH)"
                ) from None
            raise ConfigError(f"--plugin {name}: importing it failed: {e}") from None
        except ImportError as e:
            raise ConfigError(f"--plugin {name}: importing it failed: {str(e).splitlines()[0]}") from None
    return modules

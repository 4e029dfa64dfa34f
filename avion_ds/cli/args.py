"""The command-line conventions every `avion-ds` subcommand shares (light: no torch import).

* every long option is accepted spelled with ``-`` or ``_`` (``--deepspeed_config`` as DeepSpeed's
  launcher users write it, ``--deepspeed-config``, ``--dry_run``, ``--dry-run``): ``Parser``;
* ``--help`` shows each option's default;
* a recipe is ``--config RECIPE`` and a run directory (or weights file) ``--checkpoint RUN`` on every
  command; a command that took it positionally keeps the positional spelling as an alias, with a
  one-line note (``alias_positional``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

SPELLING = "options take - or _ alike (--deepspeed_config = --deepspeed-config)"


class DefaultsFormatter(argparse.HelpFormatter):
    """Help lines end with ``(default: X)`` where the option has a meaningful default the text does not state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default in (None, False, [], argparse.SUPPRESS)
            or isinstance(action, argparse._HelpAction)
        ):
            return text
        return f"{text} (default: %(default)s)"


def respell(args: Sequence[str], known: set[str]) -> list[str]:
    """``args`` with each ``--long_option`` / ``--long-option`` not in ``known`` replaced by its other
    spelling when that one is (``--opt=value`` kept together); values and ``--`` onwards untouched."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return [*out, *args[i:]]
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if name not in known:
                for alt in ("--" + name[2:].replace("_", "-"), "--" + name[2:].replace("-", "_")):
                    if alt in known:
                        name = alt
                        break
            arg = name + eq + value
        out.append(arg)
    return out


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the shared conventions (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        epilog = kwargs.get("epilog")
        kwargs["epilog"] = f"{epilog}; {SPELLING}" if epilog else SPELLING
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(respell(args, set(self._option_string_actions)), namespace)


def add_positional_alias(parser: argparse.ArgumentParser, flag: str, dest: str) -> None:
    """An optional positional ``{dest}_positional``: the older spelling of ``flag`` (see ``alias_positional``)."""
    parser.add_argument(f"{dest}_positional", nargs="?", default=None, metavar=dest.upper(), help=f"same as {flag}")


def alias_positional(
    args: argparse.Namespace, flag: str, dest: str, prog: str, required: bool = True, note: bool = True
) -> None:
    """Fold the positional alias into ``args.<dest>``: a one-line note when it was used (``note``), a usage
    error (exit 2) when both or neither (``required``) were given."""
    given = getattr(args, f"{dest}_positional")
    if given is not None:
        if getattr(args, dest) is not None:
            print(f"{prog}: error: give {flag} once (positional {given!r} and {flag})", file=sys.stderr)
            raise SystemExit(2)
        if note:
            print(f"note: {prog} {given} is spelled {prog} {flag} {given} (the positional form stays accepted)")
        setattr(args, dest, given)
    if required and getattr(args, dest) is None:
        print(f"{prog}: error: the following arguments are required: {flag}", file=sys.stderr)
        raise SystemExit(2)

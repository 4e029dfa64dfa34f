"""Reading a recipe: YAML + dotted ``--set`` overrides -> a plain mapping -> a typed, checked Recipe.

Unknown or mistyped keys fail at load time naming the key (with a did-you-mean); values are coerced to
the annotated type; a renamed key's old spelling is moved to its new name (``recipe.rename_key``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from avion_ds.config.checks import validate
from avion_ds.config.recipe import RECIPE_FIELDS, ConfigError, Recipe, registered_sections, resolve_renamed


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Coerce ``value`` to annotation ``tp`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is list:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        kt, vt = args if args else (str, Any)
        return {_coerce(k, kt, key): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    return value


def _unknown_key_error(names: list[str], key: str, prefix: str) -> ConfigError:
    """One line naming ``prefix + key`` with the closest of ``names`` (or all of them)."""
    initials = "".join(w[:1] for w in key.split("_"))  # learning_rate -> lr
    close = [n for n in names if "_" in key and n == initials] or difflib.get_close_matches(key, names, n=3)
    close = close or [n for n in names if set(n.split("_")) & set(key.split("_"))][:3]  # a shared word
    hint = f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(names)})"
    return ConfigError(f"unknown recipe key {prefix + key!r}{hint}")


def _build(cls: type, data: Any, prefix: str = "") -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'recipe'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            names = [f.name for f in dataclasses.fields(cls)]
            raise _unknown_key_error(names, str(key), f"{prefix}." if prefix else "")
        kwargs[key] = _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key)
    return cls(**kwargs)


def _build_recipe(data: Any) -> Recipe:
    """A Recipe from a mapping: core keys as fields, registered sections into ``sections``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe: expected a mapping, got {data!r}")
    sections = registered_sections()
    core, extra = {}, {}
    for key, value in data.items():
        if key in RECIPE_FIELDS:
            core[key] = value
        elif key in sections:
            extra[key] = _build(sections[key].cls, value, str(key))
        else:
            raise _unknown_key_error([*RECIPE_FIELDS, *sections], str(key), "")
    recipe = _build(Recipe, core)
    recipe.sections.update(extra)
    return recipe


def with_defaults(data: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``data`` with ``defaults`` (section -> key -> value) under its own keys (the recipe's keys win)."""
    out = dict(data)
    for section, values in defaults.items():
        given = out.get(section) or {}
        if not isinstance(given, dict):
            return data  # reported by _build
        out[section] = {**values, **given}
    return out


def recipe_from_dict(data: dict[str, Any], defaults: dict[str, dict[str, Any]] | None = None) -> Recipe:
    """A Recipe from a plain mapping (as read from YAML) with ``defaults`` under it, generically validated.

    Task-specific defaults and checks come from the task (``avion_ds.tasks.load_recipe`` is the loader)."""
    recipe = _build_recipe(with_defaults(resolve_renamed(data), defaults or {}))
    validate(recipe)
    return recipe


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested mapping, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        dotted, raw = item.split("=", 1)
        parts = dotted.strip().split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(
                f"--set {dotted.strip()}={raw}: value is not valid YAML "
                f"({str(e).splitlines()[0]}); quote strings, write lists as [a, b]"
            ) from None
    return data


def _yaml_where(e: yaml.YAMLError) -> str:
    """``:LINE:COLUMN`` (1-based) of a YAML error, where the parser knows it."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    problem, context = getattr(e, "problem", None), getattr(e, "context", None)
    if problem:
        return f"{context}, {problem}" if context else str(problem)
    return str(e).splitlines()[0]


def load_recipe_data(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The mapping of a YAML recipe (empty when ``path`` is None) with dotted overrides applied; nothing
    validated yet (``avion_ds.tasks.load_recipe`` builds and checks the Recipe)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"recipe file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {p}{_yaml_where(e)} is not valid YAML: {_yaml_problem(e)}") from None
        if data == {}:
            raise ConfigError(
                f"recipe {p} is empty: it needs at least model.name, model.heads or "
                "model.num_classes and the data section (see launch/recipes/*.yaml)"
            )
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {p}: top level must be a mapping, got {type(data).__name__}")
    apply_overrides(data, overrides or [])
    return data


def save_recipe(recipe: Recipe, path: str | Path) -> None:
    """Write the resolved recipe as YAML (into the run directory). ``model.trust_checkpoint`` is written
    false: trust is given per command, never by a file of the run directory (``engine.trust``)."""
    data = recipe.to_dict()
    data["model"]["trust_checkpoint"] = False
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def add_override_option(parser: argparse.ArgumentParser, example: str = "data.root=PATH") -> None:
    """The ``--set KEY=VALUE`` option every recipe-reading command shares (collected in ``args.overrides``)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"dotted recipe override, repeatable (e.g. --set {example})",
    )

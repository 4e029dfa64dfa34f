"""The Recipe: the core sections as fields, plus the sections tasks register; renamed keys.

A task (or a plugin's task) that reads keys of its own registers a section dataclass under a key with
:func:`register_section`; every Recipe built afterwards holds it (``recipe.pretrain.mask_ratio``), YAML
and ``--set`` reach it (``pretrain.mask_ratio``), ``to_dict`` writes it, and the generic checks apply
its ``choices`` and ``ranges``. A renamed key keeps its old spelling for one release through
:func:`rename_key` (a one-line deprecation note, once per process).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from avion_ds.config.sections import (
    BatchConfig,
    CheckpointConfig,
    DataConfig,
    EmaConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ScheduleConfig,
)

# (low, high, low inclusive, high inclusive); high None = unbounded
Range = tuple[float | None, float | None, bool, bool]


class ConfigError(ValueError):
    """A recipe problem, reported as one line naming the key and value."""


@dataclass(frozen=True)
class Section:
    """A registered recipe section: its key, dataclass, and the allowed values of its keys
    (``choices``: key -> allowed values, None = may be null; ``ranges``: key -> :data:`Range`)."""

    key: str
    cls: type
    choices: dict[str, tuple[Any, ...]]
    ranges: dict[str, Range]


_SECTIONS: dict[str, Section] = {}


def registered_sections() -> dict[str, Section]:
    """Key -> :class:`Section`, in registration order."""
    return dict(_SECTIONS)


def _registered_defaults() -> dict[str, Any]:
    return {key: s.cls() for key, s in _SECTIONS.items()}


@dataclass
class Recipe:
    """A whole run's description: the core sections and scalars as fields; the registered sections
    (``sections``) read as attributes too (``recipe.pretrain``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    task: str = ""  # a registered task (avion_ds.tasks); "" = the default one, filled in when loaded
    output_dir: str = "runs/default"
    seed: int = 0
    precision: str = "auto"  # auto (from ds_config) | fp32 | bf16 | fp16
    nonfinite: str = "skip"  # skip | stop
    nonfinite_max_consecutive: int = 20  # under skip: stop (exit 3) after this many non-finite micro-batches in a row
    sections: dict[str, Any] = field(default_factory=_registered_defaults)  # registered key -> section

    def __getattr__(self, name: str) -> Any:
        """A registered section (called only when no field or attribute has ``name``)."""
        sections = self.__dict__.get("sections")
        if sections is not None and name in _SECTIONS:
            return sections.setdefault(name, _SECTIONS[name].cls())  # registered after this recipe was built
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SECTIONS and "sections" in self.__dict__:
            self.sections[name] = value
        else:
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping of every section (core, then registered) and scalar: what the YAML holds."""
        out: dict[str, Any] = {}
        scalars: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "sections":
                continue
            if dataclasses.is_dataclass(value):
                out[f.name] = asdict(value)
            else:
                scalars[f.name] = copy.deepcopy(value)
        out.update({key: asdict(section) for key, section in self.sections.items()})
        return {**out, **scalars}


RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe) if f.name != "sections")


def register_section(
    key: str,
    cls: type,
    choices: dict[str, tuple[Any, ...]] | None = None,
    ranges: dict[str, Range] | None = None,
) -> type:
    """Make ``cls`` (a dataclass with defaults) the recipe section ``key``; ``choices`` / ``ranges`` name
    the section's own keys (``{"mask_type": ("tube", "random")}``). Returns ``cls``. A key the Recipe has,
    or one another class holds, is a ValueError (a programming error, not a recipe problem)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"register_section({key!r}): {cls!r} is not a dataclass")
    if not key.isidentifier() or key in RECIPE_FIELDS or key == "sections":
        raise ValueError(f"register_section: {key!r} is a core recipe key or not an identifier")
    held = _SECTIONS.get(key)
    if held is not None and (held.cls.__module__, held.cls.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"register_section: {key!r} is already {held.cls.__module__}.{held.cls.__qualname__}")
    names = {f.name for f in dataclasses.fields(cls)}
    for name in [*(choices or {}), *(ranges or {})]:
        if name.split("[")[0] not in names:
            raise ValueError(f"register_section({key!r}): {name!r} is not a field of {cls.__qualname__}")
    _SECTIONS[key] = Section(key, cls, dict(choices or {}), dict(ranges or {}))
    return cls


# ----------------------------------------------------------------------------------------------
# renamed keys: the old spelling keeps working for one release
# ----------------------------------------------------------------------------------------------
# old dotted key -> new dotted key; an entry stays one release, then goes (the old key is then unknown)
_RENAMED: dict[str, str] = {
    # activation checkpointing (recompute in backward), not checkpoint.* (saving the run)
    "model.checkpoint_every": "model.activation_checkpoint_every",
    "model.checkpoint_first_n": "model.activation_checkpoint_first_n",
    "model.checkpoint_impl": "model.activation_checkpoint_impl",
    "model.checkpoint_policy": "model.activation_checkpoint_policy",
}
_NOTED: set[str] = set()


def rename_key(old: str, new: str) -> None:
    """Accept the dotted recipe key ``old`` as ``new`` (YAML and ``--set``), with a deprecation note."""
    _RENAMED[old] = new


def renamed_keys() -> dict[str, str]:
    """Old dotted key -> new dotted key."""
    return dict(_RENAMED)


def _parent(data: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    """The mapping that holds ``dotted``'s last part (None when a section on the way is missing) and that part."""
    *path, last = dotted.split(".")
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), last


def _has(data: dict[str, Any], dotted: str) -> bool:
    node, last = _parent(data, dotted)
    return node is not None and last in node


def resolve_renamed(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a copy where changed) with each old key moved to its new name: a deprecation line on
    stderr once per process (rank 0 under a launcher); ConfigError when both spellings are given."""
    out = copy.deepcopy(data) if any(_has(data, old) for old in _RENAMED) else data
    for old, new in _RENAMED.items():
        node, last = _parent(out, old)
        if node is None or last not in node:
            continue
        value = node.pop(last)
        if _has(out, new):
            raise ConfigError(f"{old} and {new} are the same recipe key ({old} is its old name): give only {new}")
        *path, last = new.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{part}: expected a mapping, got {node!r}")
        node[last] = value
        if old not in _NOTED and os.environ.get("RANK", "0") == "0":
            print(f"deprecated: recipe key {old} is now {new} (the old name goes in the next release)", file=sys.stderr)
        _NOTED.add(old)
    return out

"""The dataset registry: what each ``data.dataset`` name declares, asked by the factory, start-up and the tasks.

A dataset declares its name, its label heads, its annotation summary (rows and classes of a split,
read without opening a video), its own recipe keys, its path checks, its extra label check, how it is
built for a split, and what the tasks and checks ask instead of its name: the kind of its labels, the
key choosing its heads, an example ``model.heads``, its evaluation segments and whether a Kinetics-710
head maps onto it. Register a :class:`DatasetSpec`, or a dataset class carrying the same declarations
as class attributes (``dataset_name``, ``annotation_summary``, optional ``dataset_heads``,
``dataset_section``, ``section_choices``, ``section_ranges``, ``check_paths``, ``check_labels``,
``split_file_optional``, ``label_kind``, ``heads_key``, ``heads_example``, ``eval_segments``,
``maps_kinetics710_head``, ``label_names``, ``eval_protocols``; the class itself is the builder)::

    @register_dataset
    class ToyDataset(VideoClipDataset):
        dataset_name = "toy"
        dataset_heads = None  # one integer label; ("verb", "noun") for several heads

        @staticmethod
        def annotation_summary(cfg, split):  # (rows, classes): int, or {head: classes}
            ...

A dataset's own keys are a dataclass (``dataset_section``), registered as the recipe section named
like the dataset (``epic_mir.val_sentences``, with ``config.register_section``). The dataset, its
summary and its checks receive the data section and that section as one object, :func:`view_config`'s
``DataConfig`` subclass, so ``cfg.val_sentences`` reads the dataset's own key.

The built-in datasets register on import of :mod:`avion_ds.data.datasets.build` (one import line
each); a dataset defined elsewhere registers the same way, by importing this module.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from avion_ds.config import ConfigError, DataConfig, Range, register_section, registered_sections

# (cfg, split, temporal_views, spatial_views, seed) -> the dataset of that split
Builder = Callable[[DataConfig, str, int, int, int], Any]
# (cfg, split) -> (rows, classes: int | {head: classes}); ValueError / FileNotFoundError naming the file
Summary = Callable[[DataConfig, str], "tuple[int, int | dict[str, int]]"]
Heads = tuple[str, ...] | None
# (cfg, split) -> None; ConfigError naming the key and the path
PathCheck = Callable[[DataConfig, str], None]
# (cfg, classes seen, classes the model's heads hold) -> one-line problem or None
LabelCheck = Callable[[DataConfig, dict[str, int], dict[str, int]], "str | None"]
# (start, end, num_frames, view, num_views) -> frame indices of an eval view under segment sampling
SegmentSampler = Callable[[int, int, int, int, int], list[int]]
# class: class indices (one label, or one per head); none: unlabelled clips; narration: video-text pairs;
# retrieval: video-text pairs with a caption relevancy matrix (EPIC-100 MIR)
LABEL_KINDS = ("class", "none", "narration", "retrieval")

T = TypeVar("T")


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset declares. ``heads``: the label heads it yields (None = one integer label), or a
    function of the data config (EPIC: verb + noun, or the action under ``epic.label``)."""

    name: str
    build: Builder
    summary: Summary
    heads: Heads | Callable[[DataConfig], Heads] = None
    check_paths: PathCheck | None = None
    check_labels: LabelCheck | None = None
    split_file_optional: bool = False  # data.train_csv / data.val_csv may be empty (unlabelled videos)
    label_kind: str = "class"  # one of LABEL_KINDS: what the tasks check a dataset is for
    heads_key: str | None = None  # the dotted key that chooses the heads (EPIC: epic.label), named in errors
    heads_example: Callable[[DataConfig], dict[str, int]] | None = None  # model.heads of a full copy (errors)
    eval_segments: SegmentSampler | None = None  # eval views under segment sampling (None: TSN midpoints)
    maps_kinetics710_head: bool = False  # its classes are a Kinetics list: a Kinetics-710 head maps onto it
    # (cfg, head) -> (class names of the head, where they come from) or None: what an export names the classes
    label_names: Callable[[DataConfig, str | None], tuple[list[str], str] | None] | None = None
    # eval.protocol name -> the protocols.Protocol measured on it (k400 on kinetics): what eval.protocol locks
    eval_protocols: Mapping[str, Any] | None = None
    # the zero-shot protocol its clips are classified with (a kind the zeroshot task registers:
    # single_label, multi_label_map, epic_actions); None: task=zeroshot does not classify this set
    zero_shot: str | None = None
    section: type | None = None  # dataclass of its own recipe keys, the recipe section named like the dataset
    section_choices: dict[str, tuple[Any, ...]] | None = None  # allowed values of the section's keys
    section_ranges: dict[str, Range] | None = None  # ranges of the section's keys

    def __post_init__(self) -> None:
        if self.label_kind not in LABEL_KINDS:
            raise ValueError(f"dataset {self.name!r}: label_kind={self.label_kind!r} is not one of {LABEL_KINDS}")
        if self.section is not None:
            shared = {f.name for f in dataclasses.fields(self.section)} & {
                f.name for f in dataclasses.fields(DataConfig)
            }
            if shared:
                raise ValueError(f"dataset {self.name!r}: its keys {sorted(shared)} are data keys already")
            register_section(self.name, self.section, self.section_choices, self.section_ranges)

    def label_heads(self, cfg: DataConfig) -> Heads:
        """The label heads this dataset yields under ``cfg``."""
        return self.heads(cfg) if callable(self.heads) else self.heads

    def heads_text(self, cfg: DataConfig, heads: tuple[str, ...]) -> str:
        """An example ``model.heads`` for error messages: the declared one, else ``{head: N, ...}``."""
        example = self.heads_example(cfg) if self.heads_example is not None else dict.fromkeys(heads, "N")
        return "{" + ", ".join(f"{h}: {n}" for h, n in example.items()) + "}"


_SPECS: dict[str, DatasetSpec] = {}
# the built-in dataset modules (avion_ds.data.datasets.<name>), in the order their datasets are listed whatever
# order they were imported in (a test or a script may import one directly first); :mod:`.build` imports them
BUILT_IN_MODULES = ("epic", "kinetics", "ssv2", "videos", "ego4d", "epic_mir", "egocentric")


def _ordered() -> list[tuple[str, DatasetSpec]]:
    """The registered (name, spec) pairs: built-ins by :data:`BUILT_IN_MODULES`, then the rest, each in
    registration order."""

    def rank(item: tuple[str, DatasetSpec]) -> int:
        module = getattr(item[1].build, "__module__", "") or ""
        short = module.removeprefix("avion_ds.data.datasets.")
        return BUILT_IN_MODULES.index(short) if short != module and short in BUILT_IN_MODULES else len(BUILT_IN_MODULES)

    return sorted(_SPECS.items(), key=rank)


def spec_of_class(cls: type) -> DatasetSpec:
    """The :class:`DatasetSpec` a dataset class declares by its class attributes (the class builds it)."""
    name = getattr(cls, "dataset_name", "")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__}: a registered dataset class needs a dataset_name string")
    if not callable(getattr(cls, "annotation_summary", None)):
        raise TypeError(f"{cls.__name__}: a registered dataset class needs annotation_summary(cfg, split)")
    return DatasetSpec(
        name=name,
        build=cls,
        summary=cls.annotation_summary,
        heads=getattr(cls, "dataset_heads", None),
        check_paths=getattr(cls, "check_paths", None),
        check_labels=getattr(cls, "check_labels", None),
        split_file_optional=bool(getattr(cls, "split_file_optional", False)),
        label_kind=getattr(cls, "label_kind", "class"),
        heads_key=getattr(cls, "heads_key", None),
        heads_example=getattr(cls, "heads_example", None),
        eval_segments=getattr(cls, "eval_segments", None),
        maps_kinetics710_head=bool(getattr(cls, "maps_kinetics710_head", False)),
        label_names=getattr(cls, "label_names", None),
        eval_protocols=getattr(cls, "eval_protocols", None),
        zero_shot=getattr(cls, "zero_shot_protocol", None),
        section=getattr(cls, "dataset_section", None),
        section_choices=getattr(cls, "section_choices", None),
        section_ranges=getattr(cls, "section_ranges", None),
    )


def register_dataset(obj: T) -> T:
    """Register a :class:`DatasetSpec` or a dataset class (decorator); returns ``obj`` unchanged.
    ValueError when the name is taken by another dataset."""
    spec = obj if isinstance(obj, DatasetSpec) else spec_of_class(obj)  # type: ignore[arg-type]
    old = _SPECS.get(spec.name)
    if old is not None and old.build is not spec.build:
        raise ValueError(f"dataset {spec.name!r} is already registered ({getattr(old.build, '__name__', old.build)})")
    _SPECS[spec.name] = spec
    return obj


def unregister_dataset(name: str) -> None:
    """Remove ``name`` from the registry (a test's or a script's own dataset); no error when absent."""
    _SPECS.pop(name, None)


def registered_names() -> tuple[str, ...]:
    """The names registered so far: the built-ins in their order, then others in registration order (import
    :mod:`.build` first for all the built-ins)."""
    return tuple(name for name, _ in _ordered())


def names_of_kind(*kinds: str) -> tuple[str, ...]:
    """The registered names whose ``label_kind`` is one of ``kinds``, in :func:`registered_names` order."""
    return tuple(name for name, spec in _ordered() if spec.label_kind in kinds)


def heads_keys() -> dict[str, tuple[str, ...]]:
    """Each dotted key some dataset's heads depend on -> the datasets that read it (``epic.label``: epic)."""
    out: dict[str, tuple[str, ...]] = {}
    for name, spec in _ordered():
        if spec.heads_key:
            out[spec.heads_key] = (*out.get(spec.heads_key, ()), name)
    return out


def unknown_dataset(key: str, value: Any, also: str = "") -> str:
    """The one-line error of a ``key`` (data.dataset / data.val_dataset) naming no registered dataset;
    ``also``: what else the key accepts, listed after the names."""
    names = registered_names()
    close = difflib.get_close_matches(str(value), names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"{key}={value!r} is not one of {', '.join(names)}{also}{hint}"


def lookup(name: str, key: str = "data.dataset") -> DatasetSpec:
    """The spec registered as ``name``; ValueError (one line naming ``key``, the value and the names) if none."""
    if name not in _SPECS:
        raise ValueError(unknown_dataset(key, name))
    return _SPECS[name]


_VIEWS: dict[type, type] = {}


def _view_class(section: type) -> type:
    """The ``DataConfig`` subclass holding the data keys and ``section``'s keys (one class per section)."""
    if section not in _VIEWS:
        name = f"{section.__name__}View"
        _VIEWS[section] = dataclasses.make_dataclass(
            name, [], bases=(DataConfig, section), namespace={"__reduce__": _reduce_view}
        )
    return _VIEWS[section]


def _reduce_view(view: Any) -> tuple[Any, tuple[type, dict[str, Any]]]:
    """Pickle a view as its section class and values (spawned data workers rebuild the class)."""
    section = type(view).__bases__[1]
    return _rebuild_view, (section, {f.name: getattr(view, f.name) for f in dataclasses.fields(view)})


def _rebuild_view(section: type, values: dict[str, Any]) -> DataConfig:
    return _view_class(section)(**values)


def view_config(cfg: DataConfig, spec: DatasetSpec, sections: Mapping[str, Any] | None = None) -> DataConfig:
    """``cfg`` as ``spec``'s dataset reads it: the data keys plus the dataset's own section, taken from
    ``sections`` (a recipe's), else from ``cfg`` when it already holds them, else the defaults."""
    if spec.section is None:
        return cfg
    own = (sections or {}).get(spec.name)
    if own is None:
        own = cfg if isinstance(cfg, spec.section) else spec.section()
    data = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(DataConfig)}
    mine = {f.name: getattr(own, f.name) for f in dataclasses.fields(spec.section)}
    return _view_class(spec.section)(**data, **mine)


def dataset_config(name: str, **keys: Any) -> DataConfig:
    """A data config for the registered dataset ``name`` with ``keys`` among the data keys and its own
    (scripts and tests: ``dataset_config("ego4d", root=..., aux_train=[...])``)."""
    spec = lookup(name)
    data_names = {f.name for f in dataclasses.fields(DataConfig)}
    data = {k: v for k, v in keys.items() if k in data_names}
    own = spec.section(**{k: v for k, v in keys.items() if k not in data_names}) if spec.section else None
    if own is None and len(data) != len(keys):
        raise TypeError(f"dataset {name!r} has no keys {sorted(set(keys) - data_names)}")
    return view_config(DataConfig(**{**data, "dataset": name}), spec, {name: own} if own is not None else None)


def section_value(sections: Mapping[str, Any], dotted: str) -> Any:
    """The value of a dataset's dotted key (``epic.label``) in a recipe's ``sections`` (default when unset)."""
    key, name = dotted.split(".", 1)
    held = sections.get(key)
    return getattr(held if held is not None else registered_sections()[key].cls(), name)


def check_file_key(key: str, value: str, kind: str = "file") -> None:
    """A dataset's path key, when set, names an existing file (or dir); ConfigError naming the key."""
    if value and not (Path(value).is_dir() if kind == "dir" else Path(value).is_file()):
        raise ConfigError(f"{key}: {kind} not found: {value}")


def check_class_list(cfg: DataConfig, split: str) -> None:
    """``data.class_list``, when set, names a file (the path check of every dataset reading class names)."""
    check_file_key("data.class_list", cfg.class_list)

"""Recipe = typed dataclasses loaded from YAML, validated once, with dotted command-line overrides.

A recipe is the whole description of a run except the DeepSpeed JSON (which the user passes
separately and `avion_ds.distributed.ds_config.build_ds_config` merges with the recipe). Unknown or
mistyped keys fail at load time naming the key; values are coerced to the annotated type.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A recipe problem, reported as one line naming the key and value."""


# ----------------------------------------------------------------------------------------------
# sections
# ----------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    name: str = "vit_base_patch16_224"
    pretrained: str | None = None  # path to a VideoMAE / HF / timm / avion_ds checkpoint
    pretrained_strict: bool = True  # refuse to train when < 90% of the backbone parameters were loaded
    trust_checkpoint: bool = (
        False  # allow full unpickling of checkpoint files: model.pretrained, resumed and evaluated runs (can run code)
    )
    num_classes: int = 400  # single-head models
    heads: dict[str, int] | None = None  # e.g. {"verb": 97, "noun": 300} (EPIC); overrides num_classes
    tubelet_size: int | None = None  # frames per token; None = the registered size's (2)
    drop_path_rate: float = 0.1
    drop_path_schedule: str | None = None  # None: the model's own (clip_vit_* / vit_clip_*: uniform) | linear | uniform
    head_drop_rate: float = 0.0
    head_init: str = "videomae"  # videomae: trunc-normal(0.02) x 0.001 | avion: N(0, 0.01), zero bias (AVION's fc_cls)
    attn_backend: str = "auto"  # auto | flash | sdpa | eager
    patch_embed: str = "linear"  # linear | conv
    # pool / pos_embed: None = the registered model's own (vit_*: mean, sincos; vit_clip_*: cls, clip)
    pool: str | None = None  # None | mean (+fc_norm) | cls
    pos_embed: str | None = None  # None | sincos | learned | clip
    activation_checkpointing: bool = False
    checkpoint_every: int = 1  # checkpoint every k-th block
    checkpoint_first_n: int | None = None  # only the first n blocks (None = all)
    checkpoint_impl: str = "torch"  # torch | deepspeed
    checkpoint_policy: str = "full"  # full: a checkpointed block keeps its input | selective: + attention, q/k/v
    compile: bool = False  # torch.compile each transformer block (regional); ZeRO 0-2
    head_label_map: str = (
        "auto"  # auto: a 710-row (Kinetics-710) head -> Kinetics-400/600/700 rows by VideoMAE V2's map | none
    )


@dataclass
class DataConfig:
    dataset: str = "epic"  # a registered dataset (avion_ds/data/datasets/registry.py; checked by tasks.build_recipe)
    root: str = ""  # chunk root (holds manifest.jsonl) or root of whole videos
    train_csv: str = ""  # annotations (ego4d: narration pickle / CSV / JSONL)
    val_csv: str = ""
    val_dataset: str = ""  # "" = dataset; e.g. epic_mir to evaluate ego4d pretraining zero-shot on EPIC MIR
    val_root: str = ""  # "" = root; videos of the validation split when they live elsewhere
    epic_label: str = "verb_noun"  # epic: verb_noun (heads verb + noun) | action (ONE head over AVION's verb:noun ids)
    aux_train: list[str] = field(default_factory=list)  # ego4d: extra narration files appended to train_csv's
    fps: float = 0.0  # frame times at this rate (AVION reads Ego4D at 30); 0 = each video's own rate
    train_sentences: str = ""  # epic_mir: EPIC_100_retrieval_train_sentence.csv
    train_relevancy: str = ""  # epic_mir: caption_relevancy_EPIC_100_retrieval_train.pkl
    val_sentences: str = ""  # epic_mir: EPIC_100_retrieval_test_sentence.csv
    val_relevancy: str = ""  # epic_mir: caption_relevancy_EPIC_100_retrieval_test.pkl
    chunked: bool = True
    num_frames: int = 16
    sampling: str = "segment"  # segment (TSN, EPIC/AVION) | stride (Kinetics/VideoMAE)
    stride: int = 4
    size: int = 224
    decoder: str = "auto"  # auto (probe on the first chunk) | decord | torchcodec | pyav | torchcodec-cuda
    decoder_threads: int = 1
    workers: int = 4
    crop_scale: list[float] = field(default_factory=lambda: [0.5, 1.0])
    crop_ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    mean_std: str = "imagenet"  # imagenet (VideoMAE) | clip (OpenAI CLIP) | openai (AVION's --norm-style openai)
    hflip: float = 0.5
    mixup: float = 0.0
    cutmix: float = 0.0
    label_smoothing: float = 0.1
    on_error: str = "skip"  # skip | raise
    decode_timeout_s: float = 60.0
    class_list: str = ""  # kinetics: class names (one a line; index = line); ssv2: labels.json ("" = next to train_csv)
    quarantine: str = "auto"  # auto: <root>/quarantine.tsv if present (written by avion-ds check) | none | PATH
    rand_aug: str = ""  # timm RandAugment spec, e.g. rand-m7-n4-mstd0.5-inc1 (same ops for every frame of a clip)
    reprob: float = 0.0  # random erasing: probability per clip, one box on every frame (pixel mode; VideoMAE: 0.25)
    num_sample: int = 1  # repeated augmentation: augmented views per loaded training clip (VideoMAE: 2)
    interpolation: str = "bilinear"  # bilinear | bicubic: crop resize and RandAugment geometric ops
    clips_per_video: int = 1  # dataset: videos — clips drawn from every video per epoch
    multi_scale: list[float] = field(default_factory=lambda: [1.0, 0.875, 0.75, 0.66])  # videos: crop scales


@dataclass
class OptimConfig:
    lr: float = 1.5e-3  # base lr for base_batch; scaled linearly by global_batch / base_batch
    base_batch: int = 256
    scale_lr: bool = True
    scale_lr_bounds: bool = False  # also scale min_lr and schedule.warmup_start_lr by global/base batch (AVION CLS)
    min_lr: float = 1e-6
    layer_decay: float = 0.75  # 1.0 disables layer-wise lr decay
    weight_decay: float = 0.05
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    clip_grad: float = 0.0  # 0 disables clipping (always written explicitly to the DS config)
    no_decay: str = "model"  # model: its no_weight_decay() + 1-d + biases | avion: AVION's rule (1-d, biases, norms)
    name: str = (
        "adamw"  # adamw | lion (DeepSpeed's Lion: sign update, decoupled decay) | sgd (momentum betas[0], AVION CLS)
    )
    weight_decay_end: float | None = (
        None  # cosine weight_decay -> this over the run, decayed groups only; None: constant
    )


@dataclass
class ScheduleConfig:
    epochs: int = 30
    warmup_epochs: float = 2.0
    warmup_start_lr: float | None = None  # None: warmup (step+1)/W x lr; a value: AVION/BEiT's linspace(start, lr, W)
    fix_lr: bool = False  # constant lr = the (scaled) base lr from the first step, no warmup or decay (AVION --fix-lr)
    steps_per_epoch: int | None = None  # cap (for smoke runs); None = full epoch


@dataclass
class BatchConfig:
    global_batch: int | None = 256  # None: micro * accum * world
    micro_batch: int = 8
    grad_accum: int | None = None  # None: derived from global / (micro * world)


@dataclass
class EvalConfig:
    every_epochs: int = 1
    temporal_views: int = 1
    spatial_views: int = 1
    batch_size: int | None = None  # None: micro_batch
    protocol: str = (
        "custom"  # k400 | ssv2 | epic | custom: locks the eval sampling and views (data/datasets/protocols.py)
    )


@dataclass
class EmaConfig:
    """Exponential moving average of the fp32 master weights (VideoMAE / AVION ``--model-ema``)."""

    decay: float = 0.0  # 0: off; VideoMAE / AVION use 0.9999 (ema = decay * ema + (1 - decay) * weights, per update)
    weights: str = "ema"  # ema | model: what validation, `avion-ds eval` of a run directory and `export` use


@dataclass
class CheckpointConfig:
    every_steps: int = 0  # 0: only at epoch end
    keep_last: int = 2
    resume: bool = True  # auto-resume from the latest complete checkpoint in output_dir


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    log_every: int = 10
    progress: bool = True


@dataclass
class PretrainConfig:
    """Masked-autoencoder pretraining (``avion_ds.tasks.pretrain``): masks and reconstruction target."""

    mask_type: str = "tube"  # tube | random (encoder mask)
    mask_ratio: float = 0.9
    decoder_mask_type: str = "none"  # none | running_cell (VideoMAE V2 dual masking)
    decoder_mask_ratio: float = 0.5
    norm_pix_loss: bool = True


@dataclass
class ContrastiveConfig:
    """Video-text contrastive pretraining (``avion_ds.tasks.contrastive``): what stays frozen."""

    freeze_temperature: bool = False  # AVION --freeze-temperature (its MODEL_ZOO commands set it)
    freeze_visual: bool = False  # the video tower gets no updates
    freeze_text: bool = False  # the text tower gets no updates


@dataclass
class ZeroShotConfig:
    """Zero-shot classification by text prompts (``avion_ds.tasks.zero_shot``)."""

    templates: str = "lavila"  # lavila: "#C C {}", "#C {}" (LaViLa --cls-use-template) | plain: "{}" | "fmt|fmt"


@dataclass
class Recipe:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    contrastive: ContrastiveConfig = field(default_factory=ContrastiveConfig)
    zeroshot: ZeroShotConfig = field(default_factory=ZeroShotConfig)
    task: str = ""  # a registered task (avion_ds.tasks); "" = the default one, filled in when loaded
    output_dir: str = "runs/default"
    seed: int = 0
    precision: str = "auto"  # auto (from ds_config) | fp32 | bf16 | fp16
    nonfinite: str = "skip"  # skip | stop
    nonfinite_max_consecutive: int = 20  # under skip: stop (exit 3) after this many non-finite micro-batches in a row

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# loading and coercion
# ----------------------------------------------------------------------------------------------
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


def _unknown_key_error(cls: type, key: str, prefix: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
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
            raise _unknown_key_error(cls, str(key), f"{prefix}." if prefix else "")
        kwargs[key] = _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key)
    return cls(**kwargs)


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
    recipe = _build(Recipe, with_defaults(data, defaults or {}))
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


# None in a tuple: the key may be left unset (null), meaning "the model's own"
_CHOICES: dict[str, tuple[str | None, ...]] = {
    "model.attn_backend": ("auto", "flash", "sdpa", "eager"),
    "model.patch_embed": ("linear", "conv"),
    "model.pool": (None, "mean", "cls"),
    "model.pos_embed": (None, "sincos", "learned", "clip"),
    "model.drop_path_schedule": (None, "linear", "uniform"),
    "model.checkpoint_impl": ("torch", "deepspeed"),
    "model.checkpoint_policy": ("full", "selective"),
    "optim.no_decay": ("model", "avion"),
    "optim.name": ("adamw", "lion", "sgd"),
    "model.head_init": ("videomae", "avion"),
    "data.epic_label": ("verb_noun", "action"),
    "ema.weights": ("ema", "model"),
    "model.head_label_map": ("auto", "none"),
    "pretrain.mask_type": ("tube", "random"),
    "pretrain.decoder_mask_type": ("none", "running_cell"),
    "data.sampling": ("segment", "stride"),
    "data.decoder": ("auto", "decord", "torchcodec", "pyav", "torchcodec-cuda"),
    "data.mean_std": ("imagenet", "clip", "openai"),
    "data.on_error": ("skip", "raise"),
    "data.interpolation": ("bilinear", "bicubic"),
    "precision": ("auto", "fp32", "bf16", "fp16"),
    "nonfinite": ("skip", "stop"),
}


def _float_fields(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    """(dotted key, value) of every float (and list-of-float) field, recursively."""
    out: list[tuple[str, float]] = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            out += _float_fields(v, key + ".")
        elif isinstance(v, float):
            out.append((key, v))
        elif isinstance(v, list):
            out += [(f"{key}[{i}]", x) for i, x in enumerate(v) if isinstance(x, float)]
    return out


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max; config stays torch-free

# key -> (low, high, low inclusive, high inclusive); high None = unbounded
_RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "optim.lr": (0.0, None, False, True),
    "optim.min_lr": (0.0, None, True, True),
    "optim.weight_decay": (0.0, None, True, True),
    "optim.weight_decay_end": (0.0, None, True, True),
    "ema.decay": (0.0, 1.0, True, False),
    "optim.eps": (0.0, None, False, True),
    "optim.clip_grad": (0.0, None, True, True),
    "optim.betas[0]": (0.0, 1.0, True, False),
    "optim.betas[1]": (0.0, 1.0, True, False),
    "schedule.warmup_epochs": (0.0, None, True, True),
    "schedule.warmup_start_lr": (0.0, None, True, True),
    "data.workers": (0, None, True, True),
    "data.decoder_threads": (0, None, True, True),
    "data.decode_timeout_s": (0.0, None, True, True),
    "data.fps": (0.0, None, True, True),
    "data.hflip": (0.0, 1.0, True, True),
    "data.mixup": (0.0, None, True, True),
    "data.cutmix": (0.0, None, True, True),
    "data.label_smoothing": (0.0, 1.0, True, False),
    "model.drop_path_rate": (0.0, 1.0, True, False),
    "model.head_drop_rate": (0.0, 1.0, True, False),
    "checkpoint.every_steps": (0, None, True, True),
    "checkpoint.keep_last": (1, None, True, True),
    "logging.log_every": (1, None, True, True),
    "eval.every_epochs": (1, None, True, True),
    "schedule.steps_per_epoch": (1, None, True, True),
    "nonfinite_max_consecutive": (1, None, True, True),
}


def _allowed(low: float | None, high: float | None, lo_inc: bool, hi_inc: bool) -> str:
    if high is None:
        return f"must be {'>=' if lo_inc else '>'} {low:g}"
    return f"must be in {'[' if lo_inc else '('}{low:g}, {high:g}{']' if hi_inc else ')'}"


def _lookup(d: dict[str, Any], dotted: str) -> Any:
    node: Any = d
    for part in dotted.replace("[", ".").replace("]", "").split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def validate(recipe: Recipe) -> None:
    """Check value ranges and choices once, at start-up; each error names key, value and what is allowed."""
    d = recipe.to_dict()
    for key, value in _float_fields(recipe):
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value} is not a finite number")
        if abs(value) > FLOAT32_MAX:  # finite in Python, inf once it reaches a float32 tensor
            raise ConfigError(f"{key}={value} overflows float32 (largest {FLOAT32_MAX:.4g})")
    for key, (low, high, lo_inc, hi_inc) in _RANGES.items():
        try:
            value = _lookup(d, key)
        except (KeyError, IndexError):
            continue
        if value is None:
            continue
        ok = (value >= low if lo_inc else value > low) and (high is None or (value <= high if hi_inc else value < high))
        if not ok:
            raise ConfigError(f"{key}={value} {_allowed(low, high, lo_inc, hi_inc)}")
    for dotted, choices in _CHOICES.items():
        section, _, key = dotted.rpartition(".")
        value = d[section][key] if section else d[key]
        if value not in choices:
            allowed = ", ".join("null (the model's own)" if c is None else c for c in choices)
            raise ConfigError(f"{dotted}={value!r} is not one of {allowed}")
    positive = {
        "data.num_frames": recipe.data.num_frames,
        "data.size": recipe.data.size,
        "data.stride": recipe.data.stride,
        "batch.micro_batch": recipe.batch.micro_batch,
        "schedule.epochs": recipe.schedule.epochs,
        "eval.temporal_views": recipe.eval.temporal_views,
        "model.checkpoint_every": recipe.model.checkpoint_every,
        "optim.base_batch": recipe.optim.base_batch,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}={value} must be positive")
    if recipe.model.checkpoint_policy == "selective" and recipe.model.checkpoint_impl != "torch":
        raise ConfigError("model.checkpoint_policy='selective' needs model.checkpoint_impl='torch'")
    if recipe.eval.spatial_views not in (1, 3):
        raise ConfigError(f"eval.spatial_views={recipe.eval.spatial_views} must be 1 or 3")
    for key, value in (
        ("batch.global_batch", recipe.batch.global_batch),
        ("batch.grad_accum", recipe.batch.grad_accum),
        ("eval.batch_size", recipe.eval.batch_size),
    ):
        if value is not None and value <= 0:
            raise ConfigError(f"{key}={value} must be positive")
    if recipe.optim.lr <= 0:
        raise ConfigError(f"optim.lr={recipe.optim.lr} must be positive")
    if len(recipe.optim.betas) != 2:
        raise ConfigError(f"optim.betas={recipe.optim.betas} must be two numbers [beta1, beta2]")
    wd_end = recipe.optim.weight_decay_end
    if wd_end is not None and recipe.optim.weight_decay == 0:
        raise ConfigError(
            f"optim.weight_decay_end={wd_end} needs optim.weight_decay > 0 (the schedule runs cosine from "
            "optim.weight_decay to it on the decayed groups)"
        )
    if not 0.0 < recipe.optim.layer_decay <= 1.0:
        raise ConfigError(f"optim.layer_decay={recipe.optim.layer_decay} must be in (0, 1]")
    for key, pair in (("data.crop_scale", recipe.data.crop_scale), ("data.crop_ratio", recipe.data.crop_ratio)):
        if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
            raise ConfigError(f"{key}={pair} must be [low, high] with 0 < low <= high")
    if recipe.data.crop_scale[1] > 1:
        raise ConfigError(
            f"data.crop_scale={recipe.data.crop_scale}: the crop area is a fraction of the frame, in (0, 1]"
        )
    if recipe.model.heads is not None:
        for head, n in recipe.model.heads.items():
            if n <= 0:
                raise ConfigError(f"model.heads.{head}={n} must be positive")
    tubelet = recipe.model.tubelet_size
    if tubelet is not None and (tubelet <= 0 or recipe.data.num_frames % tubelet):
        raise ConfigError(f"data.num_frames={recipe.data.num_frames} is not divisible by model.tubelet_size={tubelet}")
    if recipe.data.dataset == "epic" and recipe.model.heads is None:
        want = "{action: 3806}" if recipe.data.epic_label == "action" else "{verb: 97, noun: 300}"
        raise ConfigError(f"data.dataset='epic' needs model.heads (e.g. {want})")


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

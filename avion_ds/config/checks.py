"""The generic recipe checks: value ranges, choices and consistency, once at load time; each error is
one line naming the key, the value and what is allowed. A registered section's ``choices`` and
``ranges`` are checked here too; task-specific checks are the task's (``Task.validate_recipe``).
"""

from __future__ import annotations

import math
from typing import Any

from avion_ds.config.recipe import ConfigError, Range, Recipe, registered_sections

# None in a tuple: the key may be left unset (null), meaning "the model's own"
_CHOICES: dict[str, tuple[str | None, ...]] = {
    "model.attn_backend": ("auto", "flash", "sdpa", "eager"),
    "model.patch_embed": ("linear", "conv"),
    "model.pool": (None, "mean", "cls"),
    "model.pos_embed": (None, "sincos", "learned", "clip"),
    "model.drop_path_schedule": (None, "linear", "uniform"),
    "model.activation_checkpoint_impl": ("torch", "deepspeed"),
    "model.activation_checkpoint_policy": ("full", "selective"),
    "optim.no_decay": ("model", "avion"),
    "optim.name": ("adamw", "lion", "sgd"),
    "model.head_init": ("videomae", "avion"),
    "ema.weights": ("ema", "model"),
    "model.head_label_map": ("auto", "none"),
    "data.sampling": ("segment", "stride"),
    "data.decoder": ("auto", "decord", "torchcodec", "pyav", "torchcodec-cuda"),
    "data.mean_std": ("imagenet", "clip", "openai"),
    "data.on_error": ("skip", "raise"),
    "data.interpolation": ("bilinear", "bicubic"),
    "precision": ("auto", "fp32", "bf16", "fp16"),
    "nonfinite": ("skip", "stop"),
}


def _float_fields(node: Any, prefix: str = "") -> list[tuple[str, float]]:
    """(dotted key, value) of every float (and list-of-float) value of a ``to_dict()`` mapping, recursively."""
    out: list[tuple[str, float]] = []
    for name, v in node.items():
        key = f"{prefix}{name}"
        if isinstance(v, dict):
            out += _float_fields(v, key + ".")
        elif isinstance(v, float):
            out.append((key, v))
        elif isinstance(v, list):
            out += [(f"{key}[{i}]", x) for i, x in enumerate(v) if isinstance(x, float)]
    return out


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max; config stays torch-free

# key -> (low, high, low inclusive, high inclusive); high None = unbounded
_RANGES: dict[str, Range] = {
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


def _ranges_and_choices() -> tuple[dict[str, Range], dict[str, tuple[Any, ...]]]:
    """The core keys' ranges and choices plus every registered section's, by dotted key."""
    ranges, choices = dict(_RANGES), dict(_CHOICES)
    for key, section in registered_sections().items():
        ranges.update({f"{key}.{name}": r for name, r in section.ranges.items()})
        choices.update({f"{key}.{name}": c for name, c in section.choices.items()})
    return ranges, choices


def _check_values(d: dict[str, Any]) -> None:
    """Finite floats, ranges and choices over the ``to_dict()`` mapping ``d``."""
    for key, value in _float_fields(d):
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value} is not a finite number")
        if abs(value) > FLOAT32_MAX:  # finite in Python, inf once it reaches a float32 tensor
            raise ConfigError(f"{key}={value} overflows float32 (largest {FLOAT32_MAX:.4g})")
    ranges, choices = _ranges_and_choices()
    for key, (low, high, lo_inc, hi_inc) in ranges.items():
        try:
            value = _lookup(d, key)
        except (KeyError, IndexError):
            continue
        if value is None:
            continue
        ok = (value >= low if lo_inc else value > low) and (high is None or (value <= high if hi_inc else value < high))
        if not ok:
            raise ConfigError(f"{key}={value} {_allowed(low, high, lo_inc, hi_inc)}")
    for dotted, allowed_values in choices.items():
        value = _lookup(d, dotted)
        if value not in allowed_values:
            allowed = ", ".join("null (the model's own)" if c is None else str(c) for c in allowed_values)
            raise ConfigError(f"{dotted}={value!r} is not one of {allowed}")


def validate(recipe: Recipe) -> None:
    """Check value ranges and choices once, at start-up; each error names key, value and what is allowed."""
    _check_values(recipe.to_dict())
    positive = {
        "data.num_frames": recipe.data.num_frames,
        "data.size": recipe.data.size,
        "data.stride": recipe.data.stride,
        "batch.micro_batch": recipe.batch.micro_batch,
        "schedule.epochs": recipe.schedule.epochs,
        "eval.temporal_views": recipe.eval.temporal_views,
        "model.activation_checkpoint_every": recipe.model.activation_checkpoint_every,
        "optim.base_batch": recipe.optim.base_batch,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}={value} must be positive")
    if recipe.model.activation_checkpoint_policy == "selective" and recipe.model.activation_checkpoint_impl != "torch":
        raise ConfigError(
            "model.activation_checkpoint_policy='selective' needs model.activation_checkpoint_impl='torch'"
        )
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
    merge = recipe.model.token_merge
    if any(r < 0 for r in ([merge] if isinstance(merge, int) else merge)):
        raise ConfigError(f"model.token_merge={merge!r}: tokens merged per block must be >= 0 (0 = off)")
    if not 0.0 <= recipe.model.patch_dropout < 1.0:
        raise ConfigError(
            f"model.patch_dropout={recipe.model.patch_dropout!r}: the fraction of patches dropped, in [0, 1)"
        )
    _check_rlt(recipe)
    tubelet = recipe.model.tubelet_size
    if tubelet is not None and (tubelet <= 0 or recipe.data.num_frames % tubelet):
        raise ConfigError(f"data.num_frames={recipe.data.num_frames} is not divisible by model.tubelet_size={tubelet}")


def _check_rlt(recipe: Recipe) -> None:
    """``model.rlt_threshold``: a number in [0, 1); with it on, a backend that packs clips of different lengths
    (not eager), no token merging, no patch dropout, no ``model.compile`` (token counts change every step)."""
    m = recipe.model
    value = m.rlt_threshold
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"model.rlt_threshold={value!r}: expected a number in [0, 1) (0 is off)")
    if not value:
        return
    if m.attn_backend == "eager":
        raise ConfigError(
            f"model.rlt_threshold={value!r} with model.attn_backend='eager': clips of different lengths need "
            "packed attention (sdpa: torch's varlen kernel or clip by clip; flash: its varlen kernel); use auto, sdpa or flash"
        )
    if m.token_merge != 0:
        raise ConfigError(
            f"model.rlt_threshold={value!r} with model.token_merge={m.token_merge!r}: token merging needs the same "
            "token count in every clip; use one of the two"
        )
    if m.patch_dropout:
        raise ConfigError(
            f"model.rlt_threshold={value!r} with model.patch_dropout={m.patch_dropout!r}: both drop patches; "
            "use one of the two"
        )
    if m.compile:
        raise ConfigError(
            f"model.rlt_threshold={value!r} with model.compile=true: the packed token count changes every step "
            "(a recompile each time); turn one off"
        )

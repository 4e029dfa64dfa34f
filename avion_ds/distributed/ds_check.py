"""Checking a DeepSpeed config against DeepSpeed itself: its keys, its section types, its config model.

The known keys are recorded from DeepSpeed's own parser (a DeepSpeed upgrade that adds a key keeps
working); DeepSpeed's pydantic / config errors become one line naming the key.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import logging
from typing import Any

import torch
import torch.distributed as tdist

from avion_ds.config import ConfigError
from avion_ds.distributed.ds_fields import AUTO

# keys DeepSpeed reads outside ``DeepSpeedConfig._initialize_params`` (engine / initialize)
_KEYS_READ_ELSEWHERE = ("sequence_parallel_size",)
# sections that must be JSON objects when present
_SECTIONS = (
    "zero_optimization",
    "optimizer",
    "scheduler",
    "bf16",
    "fp16",
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "aio",
    "checkpoint",
    "data_types",
    "comms_logger",
)


@functools.cache
def deepspeed_config_keys() -> frozenset[str]:
    """Top-level keys DeepSpeed's own config parser reads, recorded by letting it parse a minimal config.

    Built from DeepSpeed itself (``deepspeed.runtime.config.DeepSpeedConfig``) rather than a hand list,
    so a DeepSpeed upgrade that adds a key keeps working.
    """
    from deepspeed.runtime.config import DeepSpeedConfig  # lazy: deepspeed takes seconds to import

    seen: set[str] = set()

    class _Keys:
        def __init__(self, d: dict) -> None:
            self.d = d

        def __contains__(self, k: object) -> bool:
            seen.add(str(k))
            return dict.__contains__(self.d, k)

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(dict.keys(self.d))

        def __len__(self) -> int:
            return dict.__len__(self.d)

    class _Recorder(dict):
        def get(self, k: Any, *default: Any) -> Any:
            seen.add(str(k))
            return super().get(k, *default)

        def __getitem__(self, k: Any) -> Any:
            seen.add(str(k))
            return super().__getitem__(k)

        def __contains__(self, k: object) -> bool:
            seen.add(str(k))
            return super().__contains__(k)

        def keys(self) -> Any:  # type: ignore[override]
            return _Keys(self)

    with _quiet_deepspeed():
        DeepSpeedConfig(_Recorder({"train_batch_size": 1}))
    return frozenset(seen) | frozenset(_KEYS_READ_ELSEWHERE)


@contextlib.contextmanager
def _quiet_deepspeed() -> Any:
    """DeepSpeed's INFO lines (config dumps) off while we only validate."""
    from deepspeed.utils import logger as ds_logger  # lazy: deepspeed takes seconds to import

    level = ds_logger.level
    ds_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        ds_logger.setLevel(level)


def check_user_config(cfg: dict[str, Any]) -> None:
    """Unknown top-level keys (with the closest known ones), section types, optimizer type: one line each."""
    known = deepspeed_config_keys()
    for key in cfg:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=3, cutoff=0.6)
            hint = f", did you mean {', '.join(close)}?" if close else " (not a key DeepSpeed reads)"
            raise ConfigError(f"unknown DeepSpeed key {key!r}{hint}")
    for key in _SECTIONS:
        if key in cfg and not isinstance(cfg[key], dict):
            raise ConfigError(
                f"deepspeed config {key} must be a JSON object {{...}}, got {type(cfg[key]).__name__} {cfg[key]!r}"
            )
    opt = cfg.get("optimizer")
    if opt is not None:
        name = opt.get("type")
        if name != AUTO and (not isinstance(name, str) or not _optimizer_known(name)):
            from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS  # lazy: deepspeed takes seconds to import

            names = sorted(
                set(DEEPSPEED_OPTIMIZERS) | {n for n in dir(torch.optim) if n[0].isupper() and n != "Optimizer"}
            )
            close = difflib.get_close_matches(str(name).lower(), names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
            raise ConfigError(
                f"deepspeed config optimizer.type={name!r} is neither a DeepSpeed nor a torch.optim optimizer{hint}"
            )


def _optimizer_known(name: str) -> bool:
    """DeepSpeed accepts its own optimizer names (any case) or a ``torch.optim`` class name."""
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS  # lazy: deepspeed takes seconds to import

    return name.lower() in DEEPSPEED_OPTIMIZERS or isinstance(getattr(torch.optim, name, None), type)


def validate_with_deepspeed(cfg: dict[str, Any]) -> None:
    """Let DeepSpeed's own config model check a built config now (ZeRO stage 7, "two", bad types).

    Only DeepSpeed's config errors are turned into one line; anything else propagates.
    """
    from deepspeed.runtime.config import (  # lazy: deepspeed takes seconds to import
        DeepSpeedConfig,
        DeepSpeedConfigError,
    )  # lazy: deepspeed takes seconds to import
    from pydantic import ValidationError  # lazy: DeepSpeed's config model; loads with deepspeed, not before

    # without a process group DeepSpeedConfig assumes one rank; with one (a second run in the same
    # process, e.g. tests/engine/pretrain_jobs_script.py) it checks against the live world size
    live = tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1
    one_rank = copy.deepcopy(cfg)
    one_rank["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * live
    try:  # (the batch arithmetic over all ranks is resolve_batch's, checked before)
        with _quiet_deepspeed():
            DeepSpeedConfig(one_rank)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        section = _section_of(cfg, err)
        key = f"{section}.{where}" if section and where else (section or where)
        raise ConfigError(f"deepspeed config {key}={err.get('input')!r}: {_error_text(err)}") from None
    except (DeepSpeedConfigError, AssertionError) as e:
        raise ConfigError(f"deepspeed config rejected by DeepSpeed: {str(e).splitlines()[0]}") from None


def _error_text(err: dict) -> str:
    """pydantic's message, with an enum's allowed values listed once (DeepSpeed's ZeRO stage enum has an
    alias, so pydantic says "Input should be 0, 1, 2, 3 or 3")."""
    expected = (err.get("ctx") or {}).get("expected")
    if err.get("type") != "enum" or not isinstance(expected, str):
        return str(err.get("msg"))
    values = list(dict.fromkeys(v.strip() for v in expected.replace(" or ", ", ").split(",")))
    return f"allowed values: {', '.join(values)}"


def _section_of(cfg: dict[str, Any], err: dict) -> str:
    """Which top-level section a pydantic error belongs to (pydantic only knows the model's own fields)."""
    loc = err.get("loc", ())
    for name, section in cfg.items():
        if isinstance(section, dict) and loc and str(loc[0]) in section:
            return str(name)
    return ""

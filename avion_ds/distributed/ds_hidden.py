"""The model-size "auto" values of Hugging Face's published ZeRO configs, filled from the model's hidden size.

Hugging Face's ZeRO JSONs (the ``ds_config_zero{2,3}.json`` of the Transformers DeepSpeed docs) write
``"auto"`` for ``zero_optimization.reduce_bucket_size``, ``stage3_prefetch_bucket_size`` and
``stage3_param_persistence_threshold``; the HF Trainer fills them from the model's hidden size. We fill
them with the same formulas, so such a file runs here unchanged and its numbers match the Trainer's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from avion_ds.config import ConfigError
from avion_ds.distributed.ds_fields import AUTO

# The formulas of transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_finalize
# (transformers 5.25.0, "deal with config keys that use `auto` value and rely on model's hidden_size"):
#     self.fill_only("zero_optimization.reduce_bucket_size", hidden_size * hidden_size)
#     self.fill_only("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size))
#     self.fill_only("zero_optimization.stage3_param_persistence_threshold", 10 * hidden_size)
# (the Trainer fills the two stage3_* keys under ZeRO-3 only and leaves them "auto" otherwise, which
# DeepSpeed then refuses; we fill them under every stage: DeepSpeed reads them under ZeRO-3 only).
HIDDEN_SIZE_KEYS: dict[str, Callable[[int], int]] = {
    "reduce_bucket_size": lambda h: h * h,
    "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h,
}


_READERS: list[Callable[[str], int]] = []  # model name -> hidden size; the model layers sit above this one


def register_hidden_size_reader(reader: Callable[[str], int]) -> Callable[[str], int]:
    """Set how a registered model's hidden size is read (``avion_ds.tasks.base`` registers the model
    registry's reader on import: every recipe is loaded through ``avion_ds.tasks``)."""
    _READERS[:] = [reader]
    return reader


def model_hidden_size(name: str) -> int:
    """The hidden size of registered model ``name`` (see :func:`register_hidden_size_reader`)."""
    if not _READERS:
        raise ConfigError(
            f'deepspeed config: "auto" ZeRO bucket sizes need the hidden size of {name}, which is not known '
            "here; give numbers"
        )
    return _READERS[0](name)


def fill_hidden_size_keys(cfg: dict[str, Any], model_name: str) -> dict[str, int]:
    """Fill the ``"auto"`` hidden-size keys of ``cfg["zero_optimization"]`` (in place) from ``model_name``'s
    hidden size; the values filled, by key (empty when none was "auto"). Any other "auto" ZeRO key is a
    one-line error."""
    zo = cfg.get("zero_optimization") or {}
    autos = [k for k, v in zo.items() if v == AUTO]
    for key in autos:
        if key not in HIDDEN_SIZE_KEYS:
            raise ConfigError(
                f'deepspeed config zero_optimization.{key}="auto" is not filled by avion_ds (only '
                f"{', '.join(HIDDEN_SIZE_KEYS)} are, from the model's hidden size); give a number"
            )
    if not autos:
        return {}
    hidden = model_hidden_size(model_name)
    filled = {key: HIDDEN_SIZE_KEYS[key](hidden) for key in autos}
    zo.update(filled)
    return filled


def hidden_size_line(user: dict[str, Any], built: dict[str, Any], model_name: str) -> str | None:
    """The start-up summary's line naming the hidden-size values filled into ``built`` where the user's
    JSON said "auto"; None when it said none."""
    zo_user = user.get("zero_optimization") or {}
    keys = [k for k in HIDDEN_SIZE_KEYS if zo_user.get(k) == AUTO]
    if not keys:
        return None
    zo = built.get("zero_optimization") or {}
    values = " ".join(f"{k}={zo[k]}" for k in keys)
    return (
        f'deepspeed config "auto" from the hidden size {model_hidden_size(model_name)} of {model_name} '
        f"(as the Hugging Face Trainer fills it): {values}"
    )

"""timm-style model registry: one small registered constructor per size.

``create_model(name, pretrained=None, **overrides)`` looks the name up, builds the architecture
with overrides applied, constructs the model and optionally loads weights through
``load_weights`` (weights never change the architecture). Models are any ``nn.Module``; each
family folder registers its own sizes (``vit/sizes.py``, ``mae/sizes.py``, ``clip/sizes.py``). An
architecture is any dataclass with a ``name`` and a validating ``replace``: ``registered_arch`` gives
the ``ViTArch`` of a classifier or the ``ClipArch`` of a dual encoder; a pretraining model's
``MAEArch`` comes from ``avion_ds.models.mae.sizes.pretrain_arch`` (``avion_ds.models.pretrain_arch``).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self

from torch import nn

from avion_ds.models.weights.loading import load_weights

logger = logging.getLogger(__name__)


class Arch(Protocol):
    """What the registry needs of an architecture description."""

    name: str

    def validate(self) -> Self: ...

    def replace(self, **overrides: Any) -> Self: ...


_MODELS: dict[str, Callable[..., nn.Module]] = {}
_ARCHS: dict[str, Arch] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register a constructor under its function name."""
    _MODELS[fn.__name__] = fn
    return fn


def register_arch(name: str, arch: Arch) -> Arch:
    """Record the (validated) architecture a registered name builds, for ``registered_arch``."""
    _ARCHS[name] = arch.validate()
    return _ARCHS[name]


def list_models(pattern: str | None = None) -> list[str]:
    """Sorted registered names, optionally filtered by a substring."""
    return sorted(n for n in _MODELS if pattern is None or pattern in n)


def _unknown(name: str) -> ValueError:
    close = difflib.get_close_matches(name, list(_MODELS), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(list_models())}"
    return ValueError(f"unknown model {name!r}{hint}")


def registered_arch(name: str, **overrides: Any) -> Any:
    """The architecture registered for ``name`` with overrides applied (nothing is allocated): a
    ``ViTArch`` (classifier) or a ``ClipArch`` (dual encoder). A pretraining name is refused naming
    ``pretrain_arch``, which gives its ``MAEArch``."""
    if name not in _ARCHS:
        if name in _MODELS:
            raise ValueError(
                f"{name}: a pretraining model; its architecture (MAEArch) is avion_ds.models.pretrain_arch({name!r})"
            )
        raise _unknown(name)
    return _ARCHS[name].replace(**overrides)


def create_model(name: str, pretrained: str | Path | dict | None = None, **overrides: Any) -> nn.Module:
    """Build a registered model; ``pretrained`` is any checkpoint ``load_weights`` understands.

    overrides: any ``ViTArch`` field, e.g. num_frames, img_size, tubelet_size, num_classes, heads,
    drop_path_rate, head_drop_rate, attn_backend, patch_embed, pool, pos_embed; for a dual encoder
    (``clip_*``) also ``text_<field>``, ``proj_dim``, ``freeze_logit_scale`` and ``projection``
    (see ``avion_ds.models.clip.model``).
    """
    if name not in _MODELS:
        raise _unknown(name)
    return _MODELS[name](pretrained=pretrained, **overrides)


def build_registered(
    name: str,
    pretrained: str | Path | dict | None,
    overrides: dict[str, Any],
    construct: Callable[[Any], nn.Module],
) -> nn.Module:
    """``construct`` the registered architecture with ``overrides``, then load ``pretrained`` (any
    format the model's loader knows; partitioned models are filled shard by shard)."""
    model = construct(_ARCHS[name].replace(**overrides))
    if pretrained is not None and pretrained != "":
        report = load_weights(model, pretrained)
        logger.info("%s: loaded %s", name, report.summary())
    return model

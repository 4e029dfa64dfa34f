"""The task interface: what one kind of training owns, asked by the trainer, `avion-ds eval`, preflight
and the memory probes (torchtitan's model spec, timm's training task).

A task builds its model and prepares its datasets, turns a batch into a loss and the step's logged
values, evaluates and names its metrics (and draws the evaluation's pictures), sets its recipe defaults
and checks its own recipe keys. The engine never branches on which task runs: it calls these methods.
A task may build any ``nn.Module`` (a ``VideoViT``, a masked autoencoder, a dual encoder). Adding a task =
one package in ``avion_ds/tasks`` with a ``@register_task`` class (and its recipe section,
``avion_ds.config.register_section``) + one import line in ``avion_ds/tasks/__init__.py``, or a module of
another package named by ``--plugin`` (docs/design.md).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.distributed import dist
from avion_ds.distributed.ds_hidden import register_hidden_size_reader

if TYPE_CHECKING:
    from avion_ds.config import Recipe
    from avion_ds.data.bad_input import BadInputLog

LossParts = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ModelSummary:
    """What the meta-device build of the recipe's model found (preflight's report)."""

    name: str
    params: int
    gflops: float
    grid: tuple[int, int, int]


@dataclass
class EvalOutcome:
    """One evaluation: the metrics, what the eval JSON records besides them, and the failed clips."""

    metrics: dict[str, float]
    report: dict[str, Any] | None = None  # protocol / samples / missing rows (classification)
    failed: list[dict[str, Any]] = field(default_factory=list)  # clips that failed to decode
    per_sample: list[dict[str, Any]] | None = None  # per-sample scores (classification)
    num_samples: int = 0


@dataclass(frozen=True)
class EvalContext:
    """What one evaluation runs with, handed to ``Task.evaluate`` and ``Task.eval_images`` by the trainer's
    periodic validation and `avion-ds eval` alike."""

    model: Callable[..., Any]  # a DeepSpeed engine, a plain module or a ZeRO-3 offload inference wrapper
    loader: Any  # the (distributed) evaluation loader; ``loader.dataset`` names rows and failed clips
    augment: Callable  # the on-device evaluation augmentation: (frames, labels) -> (float frames, targets)
    device: torch.device
    recipe: Recipe
    views: int = 1  # views per clip (``eval.temporal_views * eval.spatial_views``), averaged into one score
    dtype: torch.dtype = torch.float32  # the forward's input dtype
    bad_log: BadInputLog | None = None  # names bad samples once per run; None: printed


class Task(ABC):
    """One kind of training (see module doc). Instances hold no state: one per run is enough."""

    name: ClassVar[str]
    # recipe defaults of this task, section -> key -> value; keys the recipe sets win
    recipe_defaults: ClassVar[dict[str, dict[str, Any]]] = {}

    # ------------------------------------------------------------------ recipe and preflight
    @abstractmethod
    def validate_recipe(self, recipe: Recipe) -> None:
        """This task's checks on a built recipe (ConfigError: one line naming the key)."""

    @abstractmethod
    def check_model(self, recipe: Recipe) -> ModelSummary:
        """Model name, geometry and labels vs heads, built on the meta device (no weights, no process group)."""

    # ------------------------------------------------------------------ model and data
    @abstractmethod
    def build_model(
        self,
        recipe: Recipe,
        pretrained: str | None = None,
        run_dir: Path | None = None,
        ds_config: dict[str, Any] | None = None,
    ) -> nn.Module:
        """The recipe's model (partitioned under a ZeRO-3 ``ds_config``), with ``pretrained`` (default:
        ``model.pretrained``; "" for none) loaded and reported."""

    def prepare_datasets(self, recipe: Recipe, *datasets: Any) -> None:
        """Give datasets what this task draws loader-side (e.g. masks); nothing by default."""

    @abstractmethod
    def label_classes(self, recipe: Recipe) -> int | dict[str, int]:
        """Class count(s) the on-device augmentation shapes targets for (0: no class targets)."""

    @abstractmethod
    def synthetic_batch(self, recipe: Recipe, batch_size: int, device: torch.device | str = "cpu") -> dict[str, Any]:
        """A batch of random clips as the loss takes them after augmentation (``frames`` float (B, C, T, H, W),
        ``label`` the task's targets): measuring a step without data (``plan --measure``, benchmarks)."""

    def memory_estimator(self, recipe: Recipe) -> Callable[..., Any] | None:
        """This task's step memory for ``avion-ds plan --config`` where it differs from its model's as the
        planner counts it by name (e.g. a frozen teacher, visible tokens only): a callable
        ``(micro_batch, dtype, zero_stage, **avion_ds.memory.estimate.estimate's keywords) -> MemoryEstimate``;
        None (default): the model's."""
        return None

    # ------------------------------------------------------------------ one step
    @abstractmethod
    def loss(
        self, model: Callable[..., Any], x: torch.Tensor, targets: Any, dtype: torch.dtype, recipe: Recipe
    ) -> LossParts:
        """Forward ``x`` (float32 frames after augmentation) through ``model`` to the loss and the named
        values logged beside it (e.g. ``loss_verb``, ``clip_acc``); nothing read on the host."""

    def after_step(self, engine: Any) -> None:
        """Called on every rank after each applied optimizer step (e.g. AVION's temperature clamp); none by default."""

    # the metric whose best value keeps its checkpoint (higher is better); None: none kept
    best_metric: ClassVar[str | None] = None

    # a task whose loss couples the micro-batches of an accumulation window (a contrastive batch is the
    # whole window) sets this and implements ``window_losses``; the trainer then hands it whole windows
    whole_window: ClassVar[bool] = False

    def window_losses(
        self, model: Callable[..., Any], xs: list[torch.Tensor], targets: list[Any], dtype: torch.dtype, recipe: Recipe
    ) -> Iterator[LossParts]:
        """One (loss, logged values) per micro-batch of a window, each yielded before its backward; the
        gradients of the window's backwards sum (no division by the accumulation steps) to the gradient
        of the window's loss. Only for ``whole_window`` tasks."""
        raise NotImplementedError(f"task {self.name!r} does not set whole_window")

    # ------------------------------------------------------------------ evaluation
    @abstractmethod
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        """Metrics over ``ctx.loader`` on all ranks (the sampler's padding removed)."""

    def eval_images(self, ctx: EvalContext, outcome: EvalOutcome) -> dict[str, np.ndarray]:
        """Pictures of the evaluation that produced ``outcome``, ``{tag: (H, W, 3) uint8}``, for TensorBoard.

        Called on every rank right after ``evaluate`` (the same ``ctx``, the same weights) when
        ``logging.tensorboard`` is on, so it may run ``ctx.model`` (ZeRO-3 needs every rank); rank 0's are
        logged. Default: none."""
        return {}

    def eval_line(self, metrics: dict[str, float], report: dict[str, Any] | None = None) -> str:
        """How `avion-ds eval` prints the metrics (``report``: the rest of the eval JSON, for a task whose
        headline figure lives there)."""
        return " ".join(f"{k}={v:.2f}" for k, v in metrics.items())


def maps_kinetics710_head(recipe: Recipe) -> bool:
    """Whether the recipe's ``model.pretrained`` load maps a Kinetics-710 head onto its Kinetics-400 / 600 /
    700 head (``model.head_label_map: auto`` and a dataset whose classes are a Kinetics list, as VideoMAE
    V2's fine-tuning)."""
    from avion_ds.data.datasets.build import dataset_spec  # lazy: the dataset registry imports every dataset

    return recipe.model.head_label_map == "auto" and dataset_spec(recipe.data).maps_kinetics710_head


def build_with_weights(
    recipe: Recipe,
    kwargs: dict[str, Any],
    pretrained: str | None,
    run_dir: Path | None,
    ds_config: dict[str, Any] | None,
    **load: Any,
) -> nn.Module:
    """``create_model(recipe.model.name, **kwargs)`` (partitioned under a ZeRO-3 ``ds_config``) with
    ``pretrained`` (default ``model.pretrained``; "" for none) loaded and reported, the weights' own
    normalisation against ``data.mean_std``; ``load``: extra arguments of ``load_and_report`` (e.g.
    ``kinetics_head``). What every task's ``build_model`` shares."""
    from avion_ds.models import create_model  # lazy: heavy (timm, torchvision)
    from avion_ds.models.weights.loading import build_partitioned  # lazy: heavy (timm)

    model = build_partitioned(lambda: create_model(recipe.model.name, **kwargs), ds_config)
    load_recipe_weights(model, recipe, pretrained, run_dir, **load)
    return model


def load_recipe_weights(
    model: nn.Module, recipe: Recipe, pretrained: str | None, run_dir: Path | None, **load: Any
) -> None:
    """Load ``pretrained`` (default ``model.pretrained``; "" for none) into ``model`` and report it, with the
    recipe's strictness, trust and ``data.mean_std`` (the weights' normalisation checked against it)."""
    from avion_ds.models.weights.loading import load_and_report  # lazy: heavy (timm, torchvision)

    m = recipe.model
    source = pretrained if pretrained is not None else m.pretrained
    if source:
        load_and_report(
            model,
            str(source),
            strict=m.pretrained_strict,
            trust=m.trust_checkpoint,
            run_dir=run_dir,
            is_main=dist.is_main(),
            mean_std=recipe.data.mean_std,
            **load,
        )


def check_token_merge(recipe: Recipe, name: str, kw: dict[str, Any]) -> None:
    """``model.token_merge`` against the video transformer that ``create_model(name, **kw)`` builds (its
    depth and token count): one ConfigError line naming the key and value."""
    from avion_ds.models import registered_arch  # lazy: heavy (timm, torchvision)

    value = recipe.model.token_merge
    if value == 0:
        return
    try:
        arch = registered_arch(name, **{**kw, "token_merge": 0}).video_transformer
    except ValueError:
        return  # another option is wrong: the caller's own check names it
    problem = dataclasses.replace(arch, token_merge=value).token_merge_problem()
    if problem is not None:
        raise ConfigError(f"model.token_merge={value!r}: {problem} ({name}, depth {arch.depth})")


@register_hidden_size_reader
def model_hidden_size(name: str) -> int:
    """The hidden size of registered model ``name`` (what DeepSpeed's "auto" ZeRO bucket sizes are filled
    from, ``avion_ds.distributed.ds_hidden``): its video transformer's width (``avion-ds models``' width
    column; a pretraining model's encoder), or the larger tower's for a dual encoder (the HF Trainer: "if
    there are many hidden sizes pick the largest one"). Nothing is built."""
    from avion_ds.models import pretrain_arch, registered_arch  # lazy: heavy (timm, torchvision)
    from avion_ds.models.mae.sizes import pretrain_names  # lazy: heavy (timm, torchvision)

    try:
        arch = pretrain_arch(name) if name in pretrain_names() else registered_arch(name)
    except ValueError as e:
        raise ConfigError(f"model.name: {e}") from None
    widths = [arch.video_transformer.embed_dim]
    text = getattr(arch, "text", None)  # a dual encoder's text tower
    if text is not None:
        widths.append(text.embed_dim)
    return int(max(widths))

"""EPIC-Kitchens-100 Multi-Instance Retrieval (MIR) fine-tuning of a video-text dual encoder, as AVION's
``scripts/main_lavila_finetune_mir.py`` (``task: mir``).

Everything but the loss and the defaults is the contrastive task's (:class:`ContrastiveTask`): the
registered dual encoder (``clip_vit_*``) started from ``model.pretrained`` (an AVION / LaViLa
checkpoint, our contrastive run directory or its export; the temporal embedding interpolated to
``data.num_frames`` as AVION's ``inflate_positional_embeds``), the feature-cache accumulation (a window
is one batch of micro x accum x world clips), and the evaluation: the zero-shot MIR protocol of AVION's
``validate_mir`` on ``EPIC_100_retrieval_test.csv`` every ``eval.every_epochs``, best checkpoint kept
by ``avg_map``.

Training rows are ``EPIC_100_retrieval_train.csv``; each clip's caption is drawn among the sentences of
``epic_mir.train_sentences`` whose relevancy (``epic_mir.train_relevancy``) to the row is above 0.1
(:class:`~avion_ds.data.datasets.epic_mir.EpicMirDataset`, AVION's ``clip_dataset.py`` lines 207-212).
The loss is AVION's ``MaxMarginRankingLoss`` (:func:`avion_ds.tasks.mir.losses.max_margin_loss`),
unweighted by the relevancy as AVION's; the temperature is frozen (AVION lines 126 and 140), so
``contrastive.freeze_temperature`` must stay true. Defaults: :data:`MIR_DEFAULTS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from avion_ds.config import ConfigError
from avion_ds.data.datasets.build import dataset_spec, split_view
from avion_ds.data.datasets.registry import names_of_kind
from avion_ds.tasks.base import LossParts
from avion_ds.tasks.contrastive.task import CONTRASTIVE_DEFAULTS, ContrastiveTask
from avion_ds.tasks.registry import register_task

if TYPE_CHECKING:
    from avion_ds.config import Recipe

# AVION scripts/main_lavila_finetune_mir.py get_args_parser and main(); keys the recipe sets win
MIR_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {**CONTRASTIVE_DEFAULTS["model"]},  # --drop-path-rate 0 (line 64); the model: the checkpoint's (125)
    "data": {
        **CONTRASTIVE_DEFAULTS["data"],  # --norm-style openai (46), RandomResizedCrop (0.5, 1.0) (258), no flip
        "dataset": "epic_mir",  # --dataset ek100_mir (34)
        "val_dataset": "epic_mir",
        "num_frames": 16,  # --clip-length 16 (44)
        "fps": 0.0,  # EPIC: each video's own rate (clip_dataset.py line 137)
    },
    "optim": {**CONTRASTIVE_DEFAULTS["optim"]},  # lr 3e-5, lr-end 1e-5, wd 0.01, betas, eps (81-87); no clip (90)
    "schedule": {
        "epochs": 100,  # --epochs 100 (76)
        "warmup_epochs": 1.0,  # --warmup-epochs 1 (77)
        "warmup_start_lr": 1e-6,  # --lr-start 1e-6 (82), cosine_scheduler(start_warmup_value) (322-325)
    },
    "eval": {"every_epochs": 5},  # --eval-freq 5 (88, 336)
    "contrastive": {"freeze_temperature": True},  # freeze_temperature=True (126), requires_grad False (140)
}


@register_task
class MirFinetuneTask(ContrastiveTask):
    """EPIC-100 MIR fine-tuning (see module doc)."""

    name = "mir"
    recipe_defaults = MIR_DEFAULTS

    def validate_recipe(self, recipe: Recipe) -> None:
        super().validate_recipe(recipe)
        d = recipe.data
        for key, value, split in (("dataset", d.dataset, "train"), ("val_dataset", d.val_dataset or d.dataset, "val")):
            if dataset_spec(d, split).label_kind != "retrieval":
                raise ConfigError(
                    f"data.{key}={value!r}: task=mir fine-tunes and evaluates on EPIC-100 retrieval "
                    f"({', '.join(names_of_kind('retrieval'))})"
                )
        spec, view = split_view(d, "train", recipe.sections)
        for key in ("train_sentences", "train_relevancy"):
            if not getattr(view, key, ""):
                raise ConfigError(
                    f"{spec.name}.{key} is empty: task=mir draws each clip's caption by relevancy (set "
                    f"{spec.name}.train_sentences and {spec.name}.train_relevancy: "
                    "EPIC_100_retrieval_train_sentence.csv, caption_relevancy_EPIC_100_retrieval_train.pkl)"
                )
        if not recipe.contrastive.freeze_temperature:
            raise ConfigError(
                "contrastive.freeze_temperature=false: the max-margin loss does not use the temperature "
                "(AVION's MIR fine-tuning freezes it); set it to true"
            )
        g = recipe.batch.global_batch
        if g is not None and g < 2:
            raise ConfigError(f"batch.global_batch={g}: the max-margin loss needs at least 2 clips (negatives)")

    def pair_loss(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], LossParts]:
        """AVION's MaxMarginRankingLoss (margin 0.2) over all ranks' rows."""
        from avion_ds.tasks.mir.losses import max_margin_loss  # lazy: imports avion_ds.models

        return max_margin_loss

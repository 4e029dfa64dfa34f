"""Zero-shot classification by text prompts with a video-text dual encoder (``task: zeroshot``), the
protocol of LaViLa's ``eval_zeroshot.py``: EPIC-100 (verb, noun and LaViLa's action head), EGTEA Gaze+
(mean class accuracy, top-1) and Charades-Ego (mAP).

Evaluation only: ``avion-ds eval --checkpoint RUN_OR_WEIGHTS --set task=zeroshot --set
data.val_dataset=epic|egtea|charades_ego ...`` (docs/zero_shot.md). The classifiers are built from the
class files (:mod:`avion_ds.tasks.zero_shot.classes`) on every rank, the clips embedded by the video tower
on all ranks, the scores gathered and put in dataset order with the sampler's padding dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.distributed import dist
from avion_ds.tasks.base import EvalContext, EvalOutcome, build_with_weights
from avion_ds.tasks.common.evaluation import eval_mode, gather_predictions
from avion_ds.tasks.common.retrieval_eval import dataset_rows_report
from avion_ds.tasks.contrastive.task import CONTRASTIVE_DEFAULTS, ContrastiveTask, _encoder_kwargs
from avion_ds.tasks.registry import register_task
from avion_ds.tasks.zero_shot.benchmarks import ZeroShotBenchmark, zero_shot_benchmark, zero_shot_benchmarks
from avion_ds.tasks.zero_shot.classes import ClassSet, resolve_templates, text_classifier, view_logits

if TYPE_CHECKING:
    from avion_ds.config import Recipe
    from avion_ds.models.weights.report import LoadReport

PROTOCOL = (
    "zero-shot by text prompts (LaViLa eval_zeroshot.py): per class, the normalised mean of the normalised "
    "text embeddings of every template x name; scores = cosine to the video embedding (one view) or the "
    "softmax of the maximum cosine over the views"
)
ZEROSHOT_DEFAULTS: dict[str, dict[str, Any]] = {
    **CONTRASTIVE_DEFAULTS,
    "data": {**CONTRASTIVE_DEFAULTS["data"], "val_dataset": "epic", "fps": 0.0},
}


def benchmark_name(recipe: Recipe) -> str:
    """The evaluated set: ``data.val_dataset``, else ``data.dataset``."""
    return recipe.data.val_dataset or recipe.data.dataset


def benchmark(recipe: Recipe) -> ZeroShotBenchmark:
    """The evaluated set's zero-shot protocol; ConfigError (one line) for a set zero-shot does not classify."""
    name = benchmark_name(recipe)
    try:
        found = zero_shot_benchmark(name)
    except KeyError as e:
        raise ConfigError(f"data.val_dataset={name!r}: {e.args[0]}") from None
    if found is None:
        raise ConfigError(
            f"data.val_dataset={name!r}: task=zeroshot classifies {', '.join(zero_shot_benchmarks())} clips"
        )
    return found


def class_sets(recipe: Recipe, dataset: Any) -> tuple[list[ClassSet], dict[str, Any]]:
    """The zero-shot heads of the evaluated set and what the eval JSON says of them; ConfigError
    (one line, naming the file) for a class file of another layout."""
    try:
        sets = benchmark(recipe).class_sets(recipe, dataset)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"zero-shot classes: {e}") from None
    report: dict[str, Any] = {
        "classes": {s.head: len(s) for s in sets},
        "class_sources": {s.head: s.source for s in sets},
    }
    for s in sets:
        if not len(s):
            raise ConfigError(f"zero-shot classes: {s.source} gives no {s.head} classes")
        report.update(s.report)
        if s.note and dist.is_main():
            print(s.note, flush=True)
    return sets, report


def check_towers(report: LoadReport, source: str) -> None:
    """Refuse weights that lack a trained text or video tower (projection included), in one line."""
    # an image CLIP has no temporal embedding: zeros (fresh) are its frame-averaging equivalent, not a gap
    lacking = [
        k
        for k in [*report.missing, *report.fresh]
        if k.startswith(("textual.", "visual.")) and "temporal_embed" not in k
    ]
    if lacking:
        tower = "text" if any(k.startswith("textual.") for k in lacking) else "video"
        raise ConfigError(
            f"--checkpoint {source}: no trained {tower} tower in it ({len(lacking)} tensors missing or fresh, "
            f"e.g. {lacking[0]}); zero-shot needs both towers of a dual encoder (ours, AVION, LaViLa, OpenAI CLIP "
            "at its own geometry)"
        )


@register_task
class ZeroShotTask(ContrastiveTask):
    """Zero-shot classification by text prompts (see module doc)."""

    name = "zeroshot"
    recipe_defaults = ZEROSHOT_DEFAULTS
    best_metric = None

    def validate_recipe(self, recipe: Recipe) -> None:
        benchmark(recipe).adjust_recipe(recipe)
        try:
            resolve_templates(recipe.zeroshot.templates)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def build_model(
        self,
        recipe: Recipe,
        pretrained: str | None = None,
        run_dir: Path | None = None,
        ds_config: dict[str, Any] | None = None,
    ) -> nn.Module:
        from avion_ds.models.weights.loading import load_and_report  # lazy: heavy (timm, torchvision)

        source = pretrained if pretrained is not None else recipe.model.pretrained
        model = build_with_weights(recipe, _encoder_kwargs(recipe), "", run_dir, ds_config)
        if source:
            m = recipe.model
            report = load_and_report(
                model,
                str(source),
                strict=False,
                trust=m.trust_checkpoint,
                run_dir=run_dir,
                is_main=dist.is_main(),
                mean_std=recipe.data.mean_std,
            )
            check_towers(report, str(source))
        return model

    def prepare_datasets(self, recipe: Recipe, *datasets: Any) -> None:
        for ds in datasets:
            if not getattr(ds, "train", True):
                ds.zero_shot_classes, ds.zero_shot_report = class_sets(recipe, ds)

    @torch.no_grad()
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        """Classifiers from the prompts, video embeddings of every clip (all ranks), the benchmark's metrics."""
        from avion_ds.models.clip.model import at_least_fp32  # lazy: heavy (timm, torchvision)

        net = getattr(ctx.model, "module", ctx.model)
        ds, bench = ctx.loader.dataset, benchmark(ctx.recipe)
        templates = resolve_templates(ctx.recipe.zeroshot.templates)
        with eval_mode(net):
            classifiers = {
                s.head: text_classifier(net.encode_text, s, templates, ctx.device) for s in ds.zero_shot_classes
            }
        past_end: set[int] = set()

        def forward(batch: dict[str, Any], x: torch.Tensor, targets: Any) -> tuple[torch.Tensor, Any, Any]:
            past_end.update(past_end_rows(batch))
            video = F.normalize(at_least_fp32(net.encode_video(x.to(ctx.dtype))), dim=-1)
            scores = {h: view_logits(video, c, ctx.views) for h, c in classifiers.items()}
            return batch["index"], scores, bench.targets(targets, ds)

        (index, scores, labels), failed = gather_predictions(ctx, forward, "zero-shot", module=net)
        metrics, extra = bench.results(scores, labels)
        report: dict[str, Any] = {
            "protocol": f"{PROTOCOL}; {bench.name}: {bench.metrics_text}",
            "benchmark": bench.name,
            "templates": list(templates),
            **ds.zero_shot_report,
            "rows": int(index.numel()),
            **dataset_rows_report(ds),
        }
        report.update(extra)
        report.update(rows_left_out(ds, past_end, int(index.numel())))
        report["chance_top1"] = {h: 100.0 / max(1, c.shape[0]) for h, c in classifiers.items()}
        return EvalOutcome(metrics, report, failed, num_samples=int(index.numel()))

    def eval_line(self, metrics: dict[str, float], report: dict[str, Any] | None = None) -> str:
        """The metrics, then what the report says of the rows: left out for a bad field, past the video end."""
        notes = [n for n in report_notes(report or {}) if n]
        return " ".join(f"{k}={v:.2f}" for k, v in metrics.items()) + "".join(f"; {n}" for n in notes)


def past_end_rows(batch: dict[str, Any]) -> set[int]:
    """Dataset indices of a batch's items flagged ``past_end`` (Charades-Ego: LaViLa's frame ids reach past the
    video's last frame)."""
    flags = batch.get("past_end")
    if flags is None:
        return set()
    return {int(i) for i, p in zip(batch["index"].tolist(), flags.tolist()) if p}


def rows_left_out(ds: Any, past_end: set[int], rows: int) -> dict[str, Any]:
    """The report's row notes: annotation rows left out for a bad field (``bad_rows``) and, for a set whose
    items say it, the evaluated rows whose frames reach past the video end (gathered from every rank)."""
    bad = list(getattr(ds, "bad_rows", []))
    out: dict[str, Any] = {"num_bad_rows": len(bad), "bad_rows": bad}
    gathered = set().union(*dist.all_gather_object(past_end))
    if hasattr(ds, "past_end_note"):
        out["num_past_end"] = len(gathered)
        out["past_end_note"] = f"{len(gathered)} of {rows} rows reach past the video end ({ds.past_end_note})"
    return out


def report_notes(report: dict[str, Any]) -> list[str]:
    """The eval line's notes: rows left out, rows past the video end, action classes from val alone."""
    notes = []
    if report.get("num_bad_rows"):
        notes.append(f"{report['num_bad_rows']} annotation rows left out (first: {report['bad_rows'][0]})")
    if report.get("num_past_end"):
        notes.append(report["past_end_note"])
    if report.get("action_classes_from") == "val only":
        notes.append(f"action classes from the validation CSV only ({report['classes'].get('action')})")
    return notes

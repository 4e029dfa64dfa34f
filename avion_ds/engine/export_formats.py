"""`avion-ds export --format hf | open_clip | avion`: a run's model in another library's layout.

The run's ``recipe.yaml`` gives the architecture; the checkpoint (consolidated as for safetensors, the
weight EMA with ``--weights ema``) loads into it strictly; then the model's kind picks the writer:

=============  ==========================================================================================
classifier     ``hf``: a ``VideoMAEForVideoClassification`` directory (:mod:`avion_ds.models.vit.hf`)
pretraining    ``hf``: a ``VideoMAEForPreTraining`` directory (:mod:`avion_ds.models.mae.hf`)
dual encoder   ``open_clip``: a directory ``open_clip.create_model("local-dir:DIR")`` loads;
               ``avion``: AVION's ``checkpoint_best.pt`` (:mod:`avion_ds.models.clip.export`)
=============  ==========================================================================================

Every Hugging Face directory also holds ``preprocessor_config.json`` (``VideoMAEImageProcessor``: the
run's size, mean / std, frame count) and, for a classifier, the dataset's class names as ``id2label``
(:mod:`avion_ds.engine.export_labels`). A format that does not fit the run's model is one line
(ConfigError, exit 2) naming the model and the formats that fit it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from avion_ds.config import ConfigError, Recipe
from avion_ds.distributed.run_log import progress
from avion_ds.engine.export import consolidated
from avion_ds.engine.export_labels import class_names, open_clip_preprocess, processor_config

FORMATS = ("safetensors", "hf", "open_clip", "avion")
FITS = {  # model kind -> the formats it exports to (besides safetensors, which every run takes)
    "classifier": ("hf",),
    "pretraining": ("hf",),
    "dual_encoder": ("open_clip", "avion"),
}
KIND_WORDS = {
    "classifier": "a video classifier",
    "pretraining": "a masked-autoencoder pretraining model",
    "dual_encoder": "a video-text dual encoder",
}


@dataclass
class RunModel:
    """A run's recipe, its model (weights loaded by :func:`load_run_weights`) and the model's kind."""

    recipe: Recipe
    model: nn.Module
    kind: str


def model_kind(model: nn.Module) -> str:
    """``classifier`` | ``pretraining`` | ``dual_encoder`` (ConfigError for another model class)."""
    from avion_ds.models.clip.model import VideoTextDualEncoder  # lazy: models take seconds to import
    from avion_ds.models.mae.model import VideoMAEPretrain  # lazy: with the line above
    from avion_ds.models.vit.model import VideoViT  # lazy: with the line above

    for cls, kind in (
        (VideoTextDualEncoder, "dual_encoder"),
        (VideoMAEPretrain, "pretraining"),
        (VideoViT, "classifier"),
    ):
        if isinstance(model, cls):
            return kind
    raise ConfigError(f"the run's model is a {type(model).__name__}: no export format but safetensors takes it")


def build_run_model(run_dir: Path, fmt: str) -> RunModel:
    """The run's model built from its ``recipe.yaml`` (no weights yet); ConfigError when ``fmt`` does not fit it."""
    from avion_ds.tasks import load_recipe, task_of  # lazy: the task registry (+ data, ~0.1 s) only for these formats

    if not (run_dir / "recipe.yaml").is_file():
        raise ConfigError(f"--format {fmt} needs {run_dir / 'recipe.yaml'} (the run's architecture)")
    recipe = load_recipe(run_dir / "recipe.yaml", ["model.drop_path_rate=0.0"])
    model = task_of(recipe).build_model(recipe, pretrained="")
    kind = model_kind(model)
    if fmt not in FITS[kind]:
        raise ConfigError(
            f"--format {fmt}: the run's model {recipe.model.name} is {KIND_WORDS[kind]}; it exports with "
            f"--format {' or '.join(('safetensors', *FITS[kind]))}"
        )
    return RunModel(recipe, model, kind)


def load_run_weights(run: RunModel, run_dir: Path, tag: str | None, trust: bool, weights: str) -> None:
    """Load the run's checkpoint ``tag`` (``weights``: model | ema) into ``run.model``, strictly."""
    from avion_ds.models import load_weights  # lazy: the models take seconds to import (export --help)

    load_weights(run.model, consolidated(run_dir, tag, trust, weights), strict=True)


def write_processor(recipe: Recipe, out: Path) -> str:
    """``preprocessor_config.json`` (``VideoMAEImageProcessor``) of the run's evaluation preprocessing in
    ``out``; a few words saying what it holds."""
    from avion_ds.models.vit.hf import import_transformers  # lazy: transformers takes seconds to import

    kw = processor_config(recipe)
    import_transformers().VideoMAEImageProcessor(**kw).save_pretrained(str(out))
    return (
        f"preprocessor_config.json: {recipe.data.size} px, {kw['num_frames']} frames, mean/std {recipe.data.mean_std}"
    )


def _hf(run: RunModel, out: Path, head: str | None) -> str:
    """The Hugging Face directory of a classifier or a pretraining model; the line's details."""
    from avion_ds.models.mae.hf import check_pretraining_exportable, save_hf_pretraining  # lazy: transformers
    from avion_ds.models.vit.hf import check_exportable, save_hf  # lazy: transformers takes seconds to import

    model = run.model
    if run.kind == "pretraining":
        if head is not None:
            raise ConfigError(f"--head {head}: a pretraining model has no classifier, drop --head")
        check_pretraining_exportable(model)
        diff = save_hf_pretraining(model, out)
        check = f"|reconstruction loss difference| {diff:.2e} on a masked clip"
        return f"Hugging Face VideoMAEForPreTraining; {write_processor(run.recipe, out)}; reloaded with transformers: {check}"
    head = check_exportable(model, head)
    classes = model.arch.heads[head] if head is not None else model.arch.num_classes
    labels, source = class_names(run.recipe, head, classes)
    diff = save_hf(model, out, head, labels)
    named = f"labels from {source}" if labels is not None else f"labels {head or 'class'}_<i> ({source})"
    return (
        f"Hugging Face VideoMAEForVideoClassification; {named}; {write_processor(run.recipe, out)}; "
        f"reloaded with transformers: max |logit difference| {diff:.2e}"
    )


def _open_clip(run: RunModel, out: Path) -> str:
    from avion_ds.models.clip.export import save_open_clip  # lazy: the models take seconds to import

    written = save_open_clip(run.model, out, open_clip_preprocess(run.recipe))
    what = f"open_clip: open_clip.create_model('local-dir:{out}') loads {written['weights'].name}"
    if "temporal" in written:
        frames = run.model.arch.vision.num_frames
        what += (
            f"; the video tower's temporal embedding ({frames} frames; OpenCLIP's image tower has none) kept in "
            f"{written['temporal']}, read back with the weights by avion_ds"
        )
    return what


def _avion(run: RunModel, out: Path) -> str:
    from avion_ds.models.clip.export import avion_model_name, save_avion  # lazy: the models take seconds to import

    style = {"openai": "openai", "imagenet": "timm"}.get(run.recipe.data.mean_std, run.recipe.data.mean_std)
    save_avion(run.model, out, style)
    arch = run.model.arch
    name = avion_model_name(arch)
    model = name if name else f"{arch.name} (AVION builds CLIP_VITB16 / CLIP_VITL14 / CLIP_VITL14_336PX only)"
    return (
        f"AVION checkpoint_best.pt layout: state_dict module.visual.* / module.textual.*, args model={model}, "
        f"clip_length={arch.vision.num_frames}, project_embed_dim={arch.vision.proj_dim}"
    )


def export_as(
    fmt: str,
    run_dir: str | Path,
    out: str | Path,
    tag: str | None,
    head: str | None = None,
    trust: bool = False,
    weights: str = "model",
) -> str:
    """Write ``run_dir``'s checkpoint ``tag`` in format ``fmt`` (hf | open_clip | avion) to ``out``; the
    line to print (what was written, where from, and the check it passed)."""
    run_dir, out = Path(run_dir), Path(out)
    if head is not None and fmt != "hf":
        raise ConfigError(f"--head {head}: only --format hf exports one head of a classifier")
    if fmt not in FORMATS[1:]:
        raise ConfigError(f"--format {fmt}: expected one of {', '.join(FORMATS[1:])} here")
    run = build_run_model(run_dir, fmt)
    with progress(desc="export (consolidate, convert + write)", total=2, unit="step") as bar:
        load_run_weights(run, run_dir, tag, trust, weights)
        bar.update(1)
        writer = {"hf": lambda: _hf(run, out, head), "open_clip": lambda: _open_clip(run, out)}
        try:  # ValueError: the target cannot express the model, or its library is missing
            details = writer.get(fmt, lambda: _avion(run, out))()
        except ValueError as e:
            raise ConfigError(f"--format {fmt}: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
        bar.update(1)
    which = f", head {head}" if head else ""
    which += ", ema weights" if weights == "ema" else ""
    return f"wrote {out} ({details}; checkpoint {tag}{which})"

"""Checks that run before any process group, data worker, dataset or real model exists.

Each failure is a :class:`~avion_ds.config.ConfigError` whose message names the key, the value
and what is allowed (one line, exit code 2). Only known validation signals are converted (a
ValueError from the model registry's architecture check, DeepSpeed's config model errors); an
unexpected exception keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError, Recipe

# the labels each dataset yields: head names for multi-head datasets, None = one integer label
DATASET_HEADS: dict[str, tuple[str, ...] | None] = {"epic": ("verb", "noun"), "kinetics": None}


@dataclass(frozen=True)
class ModelSummary:
    """What the meta-device build of the recipe's model found."""

    name: str
    params: int
    gflops: float
    grid: tuple[int, int, int]


def check_output_dir(recipe: Recipe) -> None:
    """``output_dir`` must be a directory or creatable (not a file, not under a file)."""
    path = Path(recipe.output_dir)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise ConfigError(f"output_dir={recipe.output_dir!r}: {p} is a file, not a directory; "
                              "choose a directory path")
        if p.exists():
            break


def model_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The ``create_model`` keyword arguments a recipe implies (frames/size from the data section)."""
    m = recipe.model
    kw: dict[str, Any] = {"num_frames": recipe.data.num_frames, "img_size": recipe.data.size,
                          "drop_path_rate": m.drop_path_rate, "head_drop_rate": m.head_drop_rate,
                          "attn_backend": m.attn_backend, "patch_embed": m.patch_embed, "pool": m.pool,
                          "pos_embed": m.pos_embed}
    if m.tubelet_size is not None:
        kw["tubelet_size"] = m.tubelet_size
    if m.heads is not None:
        kw["heads"] = dict(m.heads)
    else:
        kw["num_classes"] = m.num_classes
    return kw


def check_model(recipe: Recipe) -> ModelSummary:
    """Model name, geometry (size vs patch, frames vs tubelet) and heads, built on the meta device."""
    from avion_ds.models import create_model, get_arch, list_models, model_flops
    from avion_ds.models.vit import count_params

    name = recipe.model.name
    if name not in list_models():
        import difflib

        close = difflib.get_close_matches(name, list_models(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(list_models())}"
        raise ConfigError(f"model.name={name!r} is not a registered model; {hint} (avion-ds models lists them)")
    if recipe.task == "pretrain":  # masked autoencoder: the encoder's geometry (avion_ds.engine.pretrain)
        from avion_ds.engine.pretrain import model_options
        from avion_ds.models import get_mae_arch

        try:
            enc = get_mae_arch(name, **model_options(recipe)).encoder
        except (ValueError, TypeError) as e:
            raise ConfigError(f"model: {e}") from None
        with torch.device("meta"):  # FLOPs: the encoder over the whole clip (the masked share is less)
            model = create_model(name, pretrained=None, **{**model_options(recipe), "attn_backend": "eager"})
        return ModelSummary(name, count_params(model), model_flops(enc) / 1e9, enc.grid)
    base = get_arch(name)
    patch = base.patch_size
    tubelet = recipe.model.tubelet_size or base.tubelet_size
    if recipe.data.size % patch:
        raise ConfigError(f"data.size={recipe.data.size} is not divisible by the patch size {patch} of {name}; "
                          f"use a multiple of {patch}")
    if recipe.data.num_frames % tubelet:
        raise ConfigError(f"data.num_frames={recipe.data.num_frames} is not divisible by the tubelet size {tubelet} "
                          f"of {name}; use a multiple of {tubelet}")
    kw = model_kwargs(recipe)
    try:
        arch = get_arch(name, **kw)
    except ValueError as e:  # ViTArch.validate: one line naming the field
        raise ConfigError(f"model: {e}") from None
    with torch.device("meta"):  # parameters only: the backend (checked in check_runtime) changes none
        model = create_model(name, pretrained=None, **{**kw, "attn_backend": "eager"})
    return ModelSummary(name, count_params(model), model_flops(arch) / 1e9, arch.grid)


def check_heads(recipe: Recipe) -> None:
    """The model's heads must be the labels the dataset yields (EPIC: verb + noun; Kinetics: one)."""
    want = DATASET_HEADS.get(recipe.data.dataset)
    heads = recipe.model.heads
    if want is None:
        if heads is not None:
            raise ConfigError(f"model.heads={heads} but data.dataset={recipe.data.dataset!r} yields one integer "
                              "label; use model.num_classes instead of model.heads")
        return
    if heads is None or set(heads) != set(want):
        raise ConfigError(f"model.heads={heads} does not match the labels of data.dataset={recipe.data.dataset!r}: "
                          f"it needs exactly the heads {', '.join(want)} (e.g. {{verb: 97, noun: 300}})")


def check_data_layout(recipe: Recipe, need_train: bool = True) -> dict[str, int]:
    """Chunk manifest present, annotation headers right, labels within the heads; returns rows per split."""
    from avion_ds.data.build import read_annotations
    from avion_ds.data.manifest import MANIFEST_NAME, load_manifest

    d = recipe.data
    if d.chunked:
        if not (Path(d.root) / MANIFEST_NAME).is_file():
            raise ConfigError(f"data.root={d.root!r} has no {MANIFEST_NAME} (data.chunked=true): run "
                              f"`avion-ds chunk SRC {d.root}` first, or set data.chunked=false for whole videos")
        try:
            videos = load_manifest(d.root)
        except ValueError as e:
            raise ConfigError(f"data.root: {e}") from None
        if not videos:
            raise ConfigError(f"data.root={d.root!r}: {MANIFEST_NAME} lists no decodable chunks")
    rows: dict[str, int] = {}
    if d.dataset == "videos":  # unlabelled clips: an optional list of videos per split, no labels
        for split in (("train", "val") if need_train else ("val",)):
            value = getattr(d, f"{split}_csv")
            if value and not Path(value).is_file():
                raise ConfigError(f"data.{split}_csv: video list not found: {value}")
            if value:
                n = sum(1 for line in Path(value).read_text().splitlines() if line.strip())
            elif d.chunked:
                n = len(videos)
            else:
                from avion_ds.data.manifest import find_videos

                n = len(find_videos(d.root))
            rows[split] = n * d.clips_per_video  # clips per epoch
        return rows
    for split in (("train", "val") if need_train else ("val",)):
        key = f"data.{split}_csv"
        try:
            n, classes = read_annotations(d, split)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"{key}: {e}") from None
        rows[split] = n
        _check_labels(recipe, key, classes)
    return rows


def _check_labels(recipe: Recipe, key: str, classes: int | dict[str, int]) -> None:
    heads = recipe.model.heads
    have = classes if isinstance(classes, dict) else {"num_classes": classes}
    want = dict(heads) if heads is not None else {"num_classes": recipe.model.num_classes}
    for head, n in have.items():
        if head in want and n > want[head]:
            where = f"model.heads.{head}" if heads is not None else "model.num_classes"
            raise ConfigError(f"{key} has {head} labels up to {n - 1} but {where}={want[head]}; "
                              f"set {where} >= {n}")


def check_runtime(recipe: Recipe, precision: str, accelerator: str) -> None:
    """Attention backend and precision the recipe asks for must be able to run on this machine."""
    if recipe.model.attn_backend == "flash":
        from avion_ds.engine.ds_config import torch_dtype
        from avion_ds.models import get_arch, resolve_backend

        dtype = torch_dtype(precision)
        device = torch.device("cuda" if accelerator == "cuda" else accelerator)
        try:
            resolve_backend("flash", device, dtype, get_arch(recipe.model.name).head_dim)
        except RuntimeError as e:  # resolve_backend's "cannot run" signal
            raise ConfigError(f"model.attn_backend='flash' cannot run here ({str(e).split(': ', 1)[-1]}); "
                              "allowed here: auto, sdpa, eager") from None
    if precision in ("fp16", "bf16"):  # DeepSpeed's own sanity check, asked before initialize instead of inside it
        from deepspeed.accelerator import get_accelerator

        acc = get_accelerator()
        supported = {"fp32": True, "bf16": acc.is_bf16_supported(), "fp16": acc.is_fp16_supported()}
        if not supported[precision]:
            allowed = ", ".join(k for k, ok in supported.items() if ok)
            raise ConfigError(f"precision={precision} cannot run here: the {accelerator} accelerator reports no "
                              f"{precision} support; allowed here: {allowed}")


def check_weights_source(source: str, trust: bool, key: str = "model.pretrained", tag: str | None = None) -> None:
    """The weights a run will read (a file, a Hugging Face directory, or a run directory's checkpoint
    ``tag``, default its newest complete one) exist and would be accepted by the safe loader: refused
    here, before anything is written or started, instead of after the process group exists."""
    from avion_ds.models.safe_load import check_checkpoint_file
    from avion_ds.rundir import checkpoint_dir, latest_complete

    path = Path(source)
    if not path.exists():
        raise ConfigError(f"{key}={source}: file or directory not found")
    if path.is_file():
        files = [path]
    elif checkpoint_dir(path).is_dir() and not (path / "model.safetensors").is_file():
        tag = tag or latest_complete(path)
        if tag is None:
            raise ConfigError(f"{key}={source}: no complete checkpoint under {checkpoint_dir(path)}")
        files = sorted((checkpoint_dir(path) / tag).rglob("*.pt"))
    else:
        names = ("model.safetensors", "pytorch_model.bin", "mp_rank_00_model_states.pt")
        files = [path / n for n in names if (path / n).is_file()][:1]
        if not files:
            raise ConfigError(f"{key}={source}: directory holds no {', '.join(names)} and no checkpoints/")
    for f in files:
        try:
            check_checkpoint_file(f, trust)
        except ConfigError as e:
            raise type(e)(f"{key}: {e}") from None

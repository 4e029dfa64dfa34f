"""Checks that run before any process group, data worker or real model exists (used by ``run_setup``).

Each failure is a :class:`~avion_ds.config.ConfigError` whose message names the key, the value
and what is allowed (one line, exit code 2). Only known validation signals are converted (a
ValueError from the model registry's architecture check, DeepSpeed's config model errors); an
unexpected exception keeps its traceback.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError, DataConfig, Recipe
from avion_ds.data.datasets.build import split_view
from avion_ds.data.datasets.csv_rows import split_csv
from avion_ds.data.datasets.registry import DatasetSpec
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import MANIFEST_NAME, check_chunk_file
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.pack import packed_labels, shard_labels_problem
from avion_ds.data.prep.shard_index import shard_problem
from avion_ds.distributed.ds_config import torch_dtype
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.engine.parallelize import schedule_bounds
from avion_ds.engine.weights_fit import check_weights_fit
from avion_ds.models import list_models, registered_arch, resolve_backend
from avion_ds.storage.run_dir import checkpoint_dir, latest_complete, tag_files
from avion_ds.storage.safe_load import check_checkpoint_file
from avion_ds.storage.torchscript import check_torchscript, torchscript_root
from avion_ds.tasks import ModelSummary, Task


def check_training_inputs(recipe: Recipe, task: Task) -> ModelSummary:
    """Everything a training run reads or writes, checked in one pass before the DeepSpeed config is read:
    the output directory, the pretrained weights (source, then their shapes against the model), the data."""
    check_output_dir(recipe)
    if recipe.model.pretrained:
        check_weights_source(recipe.model.pretrained, recipe.model.trust_checkpoint)
    summary = check_run_inputs(recipe, task, need_train=True)
    check_weights_fit(recipe, task)  # the checkpoint's shapes against the model's, before any process
    return summary


def check_run_inputs(recipe: Recipe, task: Task, need_train: bool) -> ModelSummary:
    """Data paths, labels, model geometry: what training and evaluation both check."""
    check_data_paths(recipe, need_train)
    check_model_name(recipe)
    summary = task.check_model(recipe)
    check_data_layout(recipe, need_train)
    return summary


def check_plan(recipe: Recipe, plan: DSPlan, accelerator: str) -> None:
    """The recipe against the resolved DeepSpeed plan: the lr schedule's direction, then whether the attention
    backend and precision can run on ``accelerator``."""
    check_schedule(recipe, plan)
    check_runtime(recipe, plan.precision, accelerator)


def check_output_dir(recipe: Recipe) -> None:
    """``output_dir`` must be a directory or creatable (not a file, not under a file)."""
    path = Path(recipe.output_dir)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise ConfigError(
                f"output_dir={recipe.output_dir!r}: {p} is a file, not a directory; choose a directory path"
            )
        if p.exists():
            break


def check_data_paths(recipe: Recipe, need_train: bool = True) -> None:
    """Every data path the recipe names must exist; the error names the key and the path. The dataset of
    each split is asked once for what it may leave empty and for its own files (``check_paths``)."""
    d = recipe.data
    if d.shards:  # rows and clips come from the shards (avion-ds pack --config): nothing else is read
        splits = ("train", "val") if need_train else ("val",)
        problem = shard_problem(d.shards, splits) or shard_labels_problem(d.shards, packed_labels(d, splits))
        if problem:
            raise ConfigError(problem)
        if importlib.util.find_spec("litdata") is None:
            raise ConfigError(f"data.shards={d.shards}: reading shards needs litdata (pip install -e '.[stream]')")
        return
    _check_path("data.root", d.root, "dir", optional=False)
    for split in ("train", "val") if need_train else ("val",):
        spec, view = split_view(d, split, recipe.sections)
        _check_path(f"data.{split}_csv", split_csv(d, split), "file", optional=spec.split_file_optional)
        if spec.check_paths is not None:  # the dataset's own files and keys (class lists, auxiliary files)
            spec.check_paths(view, split)
    if d.val_root:
        _check_path("data.val_root", d.val_root, "dir", optional=False)
    if d.quarantine not in ("", "auto", "none") and not Path(d.quarantine).is_file():
        raise ConfigError(f"data.quarantine: file not found: {d.quarantine} (auto | none | a quarantine.tsv)")


def _check_path(key: str, value: str, kind: str, optional: bool) -> None:
    """``value`` names an existing ``kind`` (file | dir); empty is refused unless ``optional`` (e.g. unlabelled
    clips: without a list, every video under data.root)."""
    if not value:
        if optional:
            return
        raise ConfigError(f"{key} is empty; set it in the recipe or with --set {key}=PATH")
    path = Path(value)
    if not (path.is_dir() if kind == "dir" else path.is_file()):
        raise ConfigError(f"{key}: {kind} not found: {path}")


def _check_manifest(key: str, root: str) -> dict:
    """The chunk manifest under ``root`` (data.chunked), as ``load_manifest`` reads it; ConfigError naming ``key``."""
    if not (Path(root) / MANIFEST_NAME).is_file():
        raise ConfigError(
            f"{key}={root!r} has no {MANIFEST_NAME} (data.chunked=true): run "
            f"`avion-ds chunk SRC {root}` first, or set data.chunked=false for whole videos"
        )
    try:
        videos = load_manifest(root)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    if not videos:
        raise ConfigError(f"{key}={root!r}: {MANIFEST_NAME} lists no decodable chunks")
    return videos


def check_data_layout(recipe: Recipe, need_train: bool = True) -> dict[str, int]:
    """Chunk manifest present, annotation headers right, labels within the heads; returns rows per split."""
    d = recipe.data
    if d.shards:  # the annotation files stay with the packer; labels are checked where the shards were packed
        return {}
    if d.chunked:
        _check_manifest("data.root", d.root)
        if d.val_root:
            _check_manifest("data.val_root", d.val_root)
    rows: dict[str, int] = {}
    for split in ("train", "val") if need_train else ("val",):
        key = f"data.{split}_csv"
        spec, view = split_view(d, split, recipe.sections)
        try:  # the dataset's annotation summary (unlabelled videos: clips per epoch, no labels)
            n, classes = spec.summary(view, split)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"{key}: {e}") from None
        rows[split] = n
        _check_labels(recipe, split, classes, spec, view)
    return rows


CHUNK_SAMPLE_ROWS = 64  # rows (spread over the split) whose chunk files start-up looks at


def check_chunk_sample(ds: Any, key: str, rows: int = CHUNK_SAMPLE_ROWS) -> None:
    """The chunk files that ``rows`` rows spread over ``ds`` read are on disk as manifest.jsonl lists them (a stat
    each, nothing decoded). Refused in one line naming ``key`` when every sampled row is hit (a wrong or
    half-copied root) or under ``data.on_error: raise``; otherwise the count and the first file go into
    ``ds.chunk_problems`` and the start-up summary, and training skips those samples (named once, counted)."""
    if getattr(ds, "streams_shards", False) or not ds.cfg.chunked or not len(ds):
        return  # shard datasets check each chunk's sha256 as it is read
    picks = sorted({i * len(ds) // min(rows, len(ds)) for i in range(min(rows, len(ds)))})
    problems: list[str] = []
    for i in picks:
        try:
            entry, start, end, _ = ds.sample_span(i)
        except DataError:
            continue  # named by the row's own check when it is drawn
        touched = [c for c in entry.chunks if c.start_frame < end and c.start_frame + c.frames > start]
        found = next((p for c in touched if (p := check_chunk_file(c))), None)
        if found:
            problems.append(found)
    ds.chunk_problems = (len(problems), len(picks), problems[0] if problems else "")
    if problems and (len(problems) == len(picks) or ds.cfg.on_error == "raise"):
        raise ConfigError(
            f"{key}={ds.index.root}: {len(problems)} of {len(picks)} sampled {ds.split} rows read chunk files "
            f"that are not as manifest.jsonl lists them; first: {problems[0]} (re-run `avion-ds chunk`, or "
            f"`avion-ds check` to quarantine them)"
        )


def _check_labels(
    recipe: Recipe, split: str, classes: int | dict[str, int], spec: DatasetSpec, view: DataConfig
) -> None:
    """The classes ``split``'s annotations hold fit the model's heads (and the dataset's own label check)."""
    key, heads = f"data.{split}_csv", recipe.model.heads
    have = classes if isinstance(classes, dict) else {"num_classes": classes}
    want = dict(heads) if heads is not None else {"num_classes": recipe.model.num_classes}
    problem = spec.check_labels(view, have, want) if spec.check_labels else None
    if problem:  # e.g. EPIC's action head: exactly the map's actions
        raise ConfigError(problem)
    for head, n in have.items():
        if head in want and n > want[head]:
            where = f"model.heads.{head}" if heads is not None else "model.num_classes"
            raise ConfigError(f"{key} has {head} labels up to {n - 1} but {where}={want[head]}; set {where} >= {n}")


def check_runtime(recipe: Recipe, precision: str, accelerator: str) -> None:
    """Attention backend and precision the recipe asks for must be able to run on this machine."""
    if recipe.model.attn_backend == "flash":
        dtype = torch_dtype(precision)
        device = torch.device("cuda" if accelerator == "cuda" else accelerator)
        packed = bool(recipe.model.rlt_threshold)  # run-length tokenization: flash-attn's varlen kernel
        try:
            resolve_backend("flash", device, dtype, registered_arch(recipe.model.name).head_dim, packed=packed)
        except RuntimeError as e:  # resolve_backend's "cannot run" signal
            raise ConfigError(
                f"model.attn_backend='flash' cannot run here ({str(e).split(': ', 1)[-1]}); "
                f"allowed here: auto, sdpa{'' if packed else ', eager'}"
            ) from None
    if precision in ("fp16", "bf16"):  # DeepSpeed's own sanity check, asked before initialize instead of inside it
        from deepspeed.accelerator import get_accelerator  # lazy: deepspeed is heavy, for fp16/bf16 only

        acc = get_accelerator()
        supported = {"fp32": True, "bf16": acc.is_bf16_supported(), "fp16": acc.is_fp16_supported()}
        if not supported[precision]:
            allowed = ", ".join(k for k, ok in supported.items() if ok)
            raise ConfigError(
                f"precision={precision} cannot run here: the {accelerator} accelerator reports no "
                f"{precision} support; allowed here: {allowed}"
            )


def check_schedule(recipe: Recipe, plan: DSPlan) -> None:
    """The built-in schedule warms UP to the peak lr and decays DOWN to ``optim.min_lr``: a warmup start or
    an end above the peak (after the batch scaling) would run it backwards; refused naming the keys."""
    if plan.has_scheduler or recipe.schedule.fix_lr:
        return
    lr, min_lr, start = schedule_bounds(recipe, plan)
    for key, value in (("schedule.warmup_start_lr", start), ("optim.min_lr", min_lr)):
        if value is not None and value > lr:
            raise ConfigError(
                f"{key}={value:g} is above the peak lr {lr:g} (optim.lr after batch scaling): the schedule "
                f"would {'warm up downwards' if key.startswith('schedule') else 'rise instead of decay'}; "
                f"set {key} <= {lr:g}"
            )


def check_weights_source(source: str, trust: bool, key: str = "model.pretrained", tag: str | None = None) -> None:
    """The weights a run will read (a file, a Hugging Face directory, or a run directory's checkpoint
    ``tag``, default its newest complete one) exist and would be accepted by the safe loader: refused
    here, before anything is written or started, instead of after the process group exists."""
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"{key}={source}: file or directory not found")
    if path.is_file():
        files = [path]
    elif checkpoint_dir(path).is_dir() and not (path / "model.safetensors").is_file():
        tag = tag or latest_complete(path)
        if tag is None:
            raise ConfigError(f"{key}={source}: no complete checkpoint under {checkpoint_dir(path)}")
        check_checkpoint_tag(checkpoint_dir(path) / tag, trust, key)
        return
    else:
        names = ("model.safetensors", "pytorch_model.bin", "mp_rank_00_model_states.pt")
        files = [path / n for n in names if (path / n).is_file()][:1]
        if not files:
            raise ConfigError(f"{key}={source}: directory holds no {', '.join(names)} and no checkpoints/")
    _check_files(files, trust, key)


def check_checkpoint_tag(tag_dir: Path, trust: bool, key: str) -> None:
    """Every file of a checkpoint tag (``run_dir.tag_files``: symlinks resolved, its universal folder
    included) passes the safe loader's type check; nothing is unpickled. ConfigError naming ``key``."""
    if trust:
        return
    try:
        files = tag_files(tag_dir)
    except ConfigError as e:
        raise type(e)(f"{key}: {e}") from None
    _check_files(files, trust, key)


def _check_files(files: list[Path], trust: bool, key: str) -> None:
    for f in files:
        try:
            if torchscript_root(f) is not None:  # OpenAI's CLIP releases: read by a restricted unpickler,
                check_torchscript(f)  # whatever trust says (torch.load refuses them)
            else:
                check_checkpoint_file(f, trust)
        except ConfigError as e:
            raise type(e)(f"{key}: {e}") from None


def check_model_name(recipe: Recipe) -> None:
    """``model.name`` must be registered; the error suggests the closest names."""
    name = recipe.model.name
    if name not in list_models():
        close = difflib.get_close_matches(name, list_models(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(list_models())}"
        raise ConfigError(f"model.name={name!r} is not a registered model; {hint} (avion-ds models lists them)")

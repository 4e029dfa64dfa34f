"""The ONE place a DeepSpeed config is built: user JSON + recipe -> a complete, consistent dict.

The JSON files in ``ds_configs/`` say *how* to shard and offload (ZeRO stage, offload devices,
precision switches); the recipe says *what* to train (batch sizes, lr, clipping, schedule).
Every value the two could disagree on is written ``"auto"`` in the JSON and filled here from the
recipe; a concrete JSON value that contradicts the recipe is rejected with the numbers shown,
because DeepSpeed itself either silently picks one or fails deep inside ``initialize``.

Generated configs (``avion-ds plan``, its ``--measure`` probes, ZeRO-3 offload inference) start from
the same hand-tuned JSON (:func:`reference_config`) and change only named knobs through
``overrides`` (:func:`merge_overrides`), so they differ from ``ds_configs/*.json`` exactly there.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import FLOAT32_MAX, ConfigError, Recipe

AUTO = "auto"


@dataclass(frozen=True)
class BatchPlan:
    """Resolved batch arithmetic: global = micro x accum x world."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    world_size: int


def resolve_batch(recipe: Recipe, world_size: int) -> BatchPlan:
    """Derive global batch / grad accumulation from the recipe and world size, or explain why not."""
    b = recipe.batch
    micro, accum, glob = b.micro_batch, b.grad_accum, b.global_batch
    if world_size <= 0:
        raise ConfigError(f"world size {world_size} must be positive")
    if glob is None:
        accum = accum or 1
        glob = micro * accum * world_size
    elif accum is None:
        per_step = micro * world_size
        if glob % per_step:
            raise ConfigError(
                f"batch.global_batch {glob} is not divisible by micro {micro} x world {world_size} = {per_step}"
                " (set batch.global_batch, batch.micro_batch or batch.grad_accum so that they divide)"
            )
        accum = glob // per_step
    elif glob != micro * accum * world_size:
        raise ConfigError(
            f"batch.global_batch {glob} != micro {micro} x accum {accum} x world {world_size}"
            f" = {micro * accum * world_size}"
        )
    return BatchPlan(glob, micro, accum, world_size)


def scaled_lr(recipe: Recipe, global_batch: int) -> float:
    """Linear scaling rule: lr = base lr x global_batch / base_batch (when optim.scale_lr)."""
    o = recipe.optim
    return o.lr * global_batch / o.base_batch if o.scale_lr else o.lr


def load_user_config(user: dict | str | Path) -> dict[str, Any]:
    """Read the user's DeepSpeed JSON (path or dict); a non-JSON file is a one-line error naming it."""
    if isinstance(user, dict):
        return copy.deepcopy(user)
    path = Path(user)
    if not path.is_file():
        raise ConfigError(f"deepspeed config not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"deepspeed config {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"deepspeed config {path}: top level must be a JSON object")
    return data


PRECISIONS = ("fp32", "bf16", "fp16")  # names torch_dtype maps
DS_CONFIGS = Path(__file__).resolve().parents[2] / "ds_configs"  # the hand-tuned reference JSONs


def reference_config(name: str) -> dict[str, Any]:
    """``ds_configs/<name>.json`` of this checkout: the settings every generated config starts from."""
    path = DS_CONFIGS / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in DS_CONFIGS.glob("*.json"))) or f"none: no {DS_CONFIGS}"
        raise ConfigError(f"reference DeepSpeed config {name!r} not found (known: {known})")
    return load_user_config(path)


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``base`` with ``overrides`` deep-merged: dicts merge key by key, any other value
    replaces, ``None`` removes the key (e.g. ``{"optimizer": None}`` for an inference config)."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def fixed_batch_recipe(micro_batch: int, grad_accum: int, precision: str) -> Recipe:
    """The default recipe with only the batch shape and precision set: what a config built outside a
    training run (planner probes, offload inference) fills its "auto" values from."""
    from avion_ds.config import BatchConfig

    return dataclasses.replace(
        Recipe(),
        precision=precision,
        batch=BatchConfig(global_batch=None, micro_batch=micro_batch, grad_accum=grad_accum),
    )


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
    from deepspeed.runtime.config import DeepSpeedConfig

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
    from deepspeed.utils import logger as ds_logger

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
            import torch
            from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

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
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    return name.lower() in DEEPSPEED_OPTIMIZERS or isinstance(getattr(torch.optim, name, None), type)


def validate_with_deepspeed(cfg: dict[str, Any]) -> None:
    """Let DeepSpeed's own config model check a built config now (ZeRO stage 7, "two", bad types).

    Only DeepSpeed's config errors are turned into one line; anything else propagates.
    """
    import torch.distributed as tdist
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError
    from pydantic import ValidationError

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


def _fill(section: dict, key: str, value: Any, where: str, close: bool = False) -> None:
    """Set ``section[key]`` when absent/"auto"; reject a concrete value that differs from ``value``."""
    current = section.get(key, AUTO)
    if current == AUTO or current is None:
        section[key] = value
        return
    if close and (isinstance(current, bool) or not isinstance(current, (int, float))):
        raise ConfigError(f'deepspeed config {where}={current!r} is not a number (write a number or "auto")')
    same = math.isclose(float(current), float(value), rel_tol=1e-9, abs_tol=0.0) if close else current == value
    if not same:
        raise ConfigError(
            f"deepspeed config {where}={current!r} conflicts with the recipe value {value!r}"
            ' (write "auto" in the JSON or change the recipe)'
        )


def accelerator_name() -> str:
    """The DeepSpeed accelerator's device name (cuda, cpu, ...), without a process group."""
    try:
        from deepspeed.accelerator import get_accelerator

        return str(get_accelerator().device_name())
    except Exception:  # noqa: BLE001  (deepspeed import problems surface later, in initialize)
        return "cpu"


def _default_precision(accel: str) -> str:
    if accel == "cuda":
        import torch

        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def resolve_precision(cfg: dict[str, Any], recipe: Recipe, accel: str | None = None) -> str:
    """Pick fp32 | bf16 | fp16 from the JSON sections and recipe.precision; conflicts are errors."""
    wanted = {}
    for name in ("bf16", "fp16"):
        enabled = cfg.get(name, {}).get("enabled", False)
        if enabled == AUTO:
            continue
        wanted[name] = bool(enabled)
    json_on = [name for name, on in wanted.items() if on]
    if len(json_on) > 1:
        raise ConfigError("deepspeed config enables both bf16 and fp16; enable at most one")
    rp = recipe.precision
    if rp != "auto":
        if json_on and json_on[0] != rp:
            raise ConfigError(f"recipe precision={rp!r} conflicts with deepspeed config {json_on[0]}.enabled=true")
        return rp
    if json_on:
        return json_on[0]
    has_auto = any(cfg.get(n, {}).get("enabled") == AUTO for n in ("bf16", "fp16"))
    return _default_precision(accel or accelerator_name()) if has_auto else "fp32"


def zero_stage(cfg: dict[str, Any] | None) -> int:
    """ZeRO stage of a (built or user) DeepSpeed config; 0 when there is none. THE reader of the stage."""
    return int(((cfg or {}).get("zero_optimization") or {}).get("stage", 0))


def offload_device(cfg: dict[str, Any] | None, what: str) -> str | None:
    """Where ZeRO offloads ``what`` (``"optimizer"`` | ``"param"``): cpu | nvme, or None. THE reader of offload."""
    device = ((((cfg or {}).get("zero_optimization") or {}).get(f"offload_{what}")) or {}).get("device")
    return device if device in ("cpu", "nvme") else None


def offloads_optimizer(cfg: dict[str, Any] | None) -> bool:
    """True when the optimizer state lives on CPU/NVMe (DeepSpeed then uses its CPU Adam)."""
    return offload_device(cfg, "optimizer") is not None


def _fill_scheduler(cfg: dict[str, Any], recipe: Recipe, lr: float, steps_per_epoch: int | None) -> None:
    sched = cfg.get("scheduler")
    if not sched:
        return
    if recipe.optim.layer_decay < 1.0:  # DeepSpeed's schedulers set one lr for every group: lr_scale is lost
        raise ConfigError(
            f"deepspeed config 'scheduler' ({sched.get('type', '?')}) cannot be combined with "
            f"optim.layer_decay={recipe.optim.layer_decay:g}: DeepSpeed's schedulers drop the per-layer "
            "lr scale; remove the scheduler section (the built-in warmup + cosine honours layer "
            "decay) or set optim.layer_decay=1.0"
        )
    if recipe.optim.weight_decay_end is not None:  # the built-in schedule is the one that sets weight decay
        raise ConfigError(
            f"deepspeed config 'scheduler' ({sched.get('type', '?')}) cannot be combined with "
            f"optim.weight_decay_end={recipe.optim.weight_decay_end:g}: remove the scheduler section (the built-in "
            "warmup + cosine also runs the weight-decay schedule) or unset optim.weight_decay_end"
        )
    params = sched.setdefault("params", {})
    autos = [k for k, v in params.items() if v == AUTO]
    if autos and steps_per_epoch is None:
        raise ConfigError(f'deepspeed config scheduler.params {autos} are "auto" but steps per epoch is unknown')
    spe = steps_per_epoch or 0
    values = {
        "total_num_steps": int(recipe.schedule.epochs * spe),
        "warmup_num_steps": int(round(recipe.schedule.warmup_epochs * spe)),
        "warmup_max_lr": lr,
        "warmup_min_lr": 0.0,
        "cos_min_ratio": recipe.optim.min_lr / lr if lr > 0 else 0.0,
    }
    for key in autos:
        if key not in values:
            raise ConfigError(f'deepspeed config scheduler.params.{key}="auto" cannot be derived from the recipe')
        params[key] = values[key]


def _fill_batch(cfg: dict[str, Any], plan: BatchPlan) -> None:
    """The JSON's batch keys: integers or "auto", equal to the recipe's plan; then written from it."""
    tbs = cfg.get("train_batch_size", AUTO)
    mbs = cfg.get("train_micro_batch_size_per_gpu", AUTO)
    gas = cfg.get("gradient_accumulation_steps", AUTO)
    for key, val in (
        ("train_batch_size", tbs),
        ("train_micro_batch_size_per_gpu", mbs),
        ("gradient_accumulation_steps", gas),
    ):
        if val != AUTO and (isinstance(val, bool) or not isinstance(val, int)):
            raise ConfigError(
                f'deepspeed config {key}={val!r} is not an integer (write a number without quotes, or "auto")'
            )
    for key, val, want in (
        ("train_micro_batch_size_per_gpu", mbs, plan.micro_batch),
        ("gradient_accumulation_steps", gas, plan.grad_accum),
    ):
        if val != AUTO and val != want:
            raise ConfigError(
                f"deepspeed config {key}={val} conflicts with the recipe value {want}"
                f" (global {plan.global_batch} = micro {plan.micro_batch} x accum {plan.grad_accum}"
                f" x world {plan.world_size})"
            )
    if tbs != AUTO and tbs != plan.global_batch:
        raise ConfigError(
            f"deepspeed config train_batch_size {tbs} != micro {plan.micro_batch} x accum "
            f"{plan.grad_accum} x world {plan.world_size} = {plan.global_batch}"
        )
    cfg["train_batch_size"] = plan.global_batch
    cfg["train_micro_batch_size_per_gpu"] = plan.micro_batch
    cfg["gradient_accumulation_steps"] = plan.grad_accum


def _fill_optimizer(cfg: dict[str, Any], recipe: Recipe, plan: BatchPlan) -> float:
    """The JSON optimizer's "auto" values from the recipe (lr scaled to the global batch); returns that lr."""
    accel = accelerator_name()
    lr = scaled_lr(recipe, plan.global_batch)
    if not abs(lr) <= FLOAT32_MAX:  # each recipe value is checked alone; the scaled product can still overflow
        o = recipe.optim
        raise ConfigError(
            f"optim.lr={o.lr:g} x global batch {plan.global_batch} / optim.base_batch {o.base_batch} "
            f"= {lr:.4g} overflows float32 (largest {FLOAT32_MAX:.4g}); lower optim.lr"
        )
    if "optimizer" in cfg:
        opt = cfg["optimizer"]
        _fill_optimizer_type(opt, recipe)
        params = opt.setdefault("params", {})
        where = "optimizer.params"
        _fill(params, "lr", lr, f"{where}.lr", close=True)
        if recipe.optim.name == "sgd":
            _fill_sgd(params, recipe, where)
            return lr
        _fill(params, "betas", [float(b) for b in recipe.optim.betas], f"{where}.betas")
        if recipe.optim.name == "lion":
            _drop_foreign_keys(params, ("eps", "torch_adam"), where, "DeepSpeed's Lion", "")
        else:
            _fill(params, "eps", float(recipe.optim.eps), f"{where}.eps", close=True)
        _fill(params, "weight_decay", float(recipe.optim.weight_decay), f"{where}.weight_decay", close=True)
        # on the CPU accelerator, plain torch AdamW avoids a ~35 s FusedAdam JIT build; offload
        # needs DeepSpeed's CPU Adam, which DeepSpeed picks itself.
        if str(opt.get("type", "")).lower() in ("adam", "adamw") and accel == "cpu" and not offloads_optimizer(cfg):
            params.setdefault("torch_adam", True)
        if params.get("torch_adam") == AUTO:
            params["torch_adam"] = accel == "cpu" and not offloads_optimizer(cfg)
    return lr


# optim.name -> the DeepSpeed optimizer.type it writes ("SGD": DeepSpeed builds torch.optim.SGD)
OPTIMIZER_TYPES = {"adamw": "AdamW", "lion": "Lion", "sgd": "SGD"}


def _drop_foreign_keys(params: dict[str, Any], keys: tuple[str, ...], where: str, name: str, hint: str) -> None:
    """Remove the Adam keys an optimizer named ``name`` has no use for: "auto" silently, a value in one line."""
    for key in [k for k in keys if k in params]:
        if params[key] != AUTO:
            raise ConfigError(
                f'deepspeed config {where}.{key}={params[key]!r}: {name} has no {key} (remove it or write "auto"{hint})'
            )
        del params[key]


def _fill_sgd(params: dict[str, Any], recipe: Recipe, where: str) -> None:
    """AVION's CLS optimizer (``scripts/main_lavila_finetune_cls.py`` line 221: ``torch.optim.SGD(lr,
    momentum=betas[0], weight_decay=wd)``): momentum ``optim.betas[0]``, no Nesterov, coupled weight decay;
    the Adam keys (betas, eps, torch_adam) are refused unless "auto", then removed."""
    _drop_foreign_keys(params, ("betas", "eps", "torch_adam"), where, "SGD", "; optim.betas[0] is its momentum")
    _fill(params, "momentum", float(recipe.optim.betas[0]), f"{where}.momentum", close=True)
    _fill(params, "nesterov", False, f"{where}.nesterov")
    _fill(params, "weight_decay", float(recipe.optim.weight_decay), f"{where}.weight_decay", close=True)


def allow_sgd_under_zero(cfg: dict[str, Any], recipe: Recipe) -> None:
    """``optim.name: sgd``: DeepSpeed's ZeRO asks ``zero_allow_untested_optimizer`` for torch's SGD, and its
    optimizer offload ``zero_force_ds_cpu_optimizer: false`` (SGD runs as is on the CPU partitions)."""
    if recipe.optim.name != "sgd":
        return
    if zero_stage(cfg) > 0:
        _fill(cfg, "zero_allow_untested_optimizer", True, "zero_allow_untested_optimizer")
    if offloads_optimizer(cfg):
        _fill(cfg, "zero_force_ds_cpu_optimizer", False, "zero_force_ds_cpu_optimizer")


def _fill_optimizer_type(opt: dict[str, Any], recipe: Recipe) -> None:
    """``optimizer.type`` "auto" (or absent) from ``optim.name``; Lion or SGD in only one of the two is a
    conflict (other JSON types, e.g. Adam, are the JSON's choice under ``optim.name: adamw``)."""
    name = recipe.optim.name
    given = opt.get("type", AUTO)
    if given == AUTO or given is None:
        opt["type"] = OPTIMIZER_TYPES[name]
        return
    kind = str(given).lower()
    if any((kind == own) != (name == own) for own in ("lion", "sgd")):
        raise ConfigError(
            f"deepspeed config optimizer.type={given!r} conflicts with the recipe value optim.name={name!r}"
            ' (write "auto" in the JSON or change the recipe)'
        )


def lion_needs_client(cfg: dict[str, Any], accel: str | None = None) -> bool:
    """True when a built config's Lion cannot be DeepSpeed's JSON optimizer: on the CPU accelerator without
    offload DeepSpeed would build its GPU-only FusedLion, so the engine gets DeepSpeed's CPU Lion as a client
    optimizer instead (``engine.optim.client_optimizer``)."""
    opt = cfg.get("optimizer") or {}
    lion = str(opt.get("type", "")).lower() == "lion"
    return lion and (accel or accelerator_name()) == "cpu" and not offloads_optimizer(cfg)


def build_ds_config(
    user: dict | str | Path,
    recipe: Recipe,
    world_size: int,
    steps_per_epoch: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge the user's DeepSpeed JSON with the recipe into one complete DeepSpeed config.

    ``overrides`` are deep-merged into the JSON first (:func:`merge_overrides`): the knobs a caller
    sets on top of a reference JSON. Then fills "auto" batch sizes, optimizer lr/betas/eps/weight
    decay, scheduler steps and precision, always writes ``gradient_clipping`` explicitly (DeepSpeed
    defaults it to 1.0 otherwise), and rejects values that contradict the recipe with a one-line
    message showing the numbers.
    """
    cfg = merge_overrides(load_user_config(user), overrides)
    check_user_config(cfg)
    plan = resolve_batch(recipe, world_size)

    _fill_batch(cfg, plan)

    # ---- clipping: always explicit (0.0 disables) ----------------------------------------------
    _fill(cfg, "gradient_clipping", float(recipe.optim.clip_grad), "gradient_clipping", close=True)

    lr = _fill_optimizer(cfg, recipe, plan)
    allow_sgd_under_zero(cfg, recipe)
    _fill_scheduler(cfg, recipe, lr, steps_per_epoch)

    # ---- precision --------------------------------------------------------------------------
    precision = resolve_precision(cfg, recipe, accelerator_name())
    for name in ("bf16", "fp16"):
        section = cfg.setdefault(name, {})
        section["enabled"] = precision == name

    if recipe.ema.decay > 0 and zero_stage(cfg) == 3:
        raise ConfigError(
            f"ema.decay={recipe.ema.decay:g} is not supported with ZeRO-3 (the EMA follows the ZeRO 0-2 master "
            "weights); use ZeRO-0/1/2 (with offload_optimizer for memory) or set ema.decay=0"
        )

    if recipe.model.compile and zero_stage(cfg) == 3:
        raise ConfigError(
            "model.compile=true is not supported with ZeRO-3 (its parameter hooks break the compiled blocks); use ZeRO-0/1/2"
        )

    # ---- stage-3 values DeepSpeed's HF integration calls "auto" --------------------------------
    zo = cfg.get("zero_optimization", {})
    for key in [k for k, v in zo.items() if v == AUTO]:
        raise ConfigError(f'deepspeed config zero_optimization.{key}="auto" is not filled by avion_ds; give a number')

    cfg.setdefault("steps_per_print", 10**9)  # we log ourselves
    cfg.setdefault("wall_clock_breakdown", False)
    _reject_leftover_auto(cfg)
    return cfg


def _reject_leftover_auto(node: Any, path: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _reject_leftover_auto(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _reject_leftover_auto(v, f"{path}[{i}]")
    elif node == AUTO:
        raise ConfigError(f'deepspeed config {path}="auto" is not a value avion_ds can fill')


def precision_of(cfg: dict[str, Any]) -> str:
    """fp32 | bf16 | fp16 of a built config."""
    if cfg.get("bf16", {}).get("enabled"):
        return "bf16"
    if cfg.get("fp16", {}).get("enabled"):
        return "fp16"
    return "fp32"


def torch_dtype(precision: str) -> torch.dtype:
    """The compute dtype of a precision name (fp32 | bf16 | fp16); the one precision -> dtype map."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)

"""Weight EMA for evaluation: an exponential moving average of the fp32 MASTER weights (``ema.decay``).

VideoMAE / AVION fine-tuning (``--model-ema``, decay 0.9999) keep timm's ``ModelEmaV2`` of the module:
``ema = decay * ema + (1 - decay) * weights`` after each optimizer step. Under DeepSpeed the module holds
bf16 / fp16 copies; the fp32 masters live in the optimizer, partitioned across ranks by ZeRO-1/2 (and by
ZeRO-0's bf16 / fp16 wrapper they are one flat copy). So this EMA follows the masters where they are, a
fragment per parameter and rank, with no communication per step (timm's ``ModelEmaV2`` would average the
16-bit module copies instead). What each rank averages:

* ZeRO-1/2 (any precision): its fragment of each parameter's fp32 partition (``param._hp_mapping``,
  the link DeepSpeed's ``safe_get_full_fp32_param`` uses), on the device the partition lives on
  (the CPU under ``offload_optimizer``);
* ZeRO-0 bf16 / fp16: the wrapper's fp32 master of the parameter (``fp32_groups_flat`` /
  ``fp32_groups``; every rank holds all of it);
* ZeRO-0 fp32: the parameters themselves.

ZeRO-3 is refused at start-up (``build_ds_config``). Only trainable parameters are averaged (buffers and
frozen parameters are the model's). The EMA starts as a copy of the masters when the engine is built
(after the pretrained weights are loaded) and is updated after every APPLIED optimizer step (a skipped
non-finite window or an fp16 overflow leaves it unchanged).

Checkpoints: each rank writes ``ema_rank<r>.pt`` (name -> shape, offset in the flattened parameter, fp32
values) into the tag; ZeRO-0's full copies only on rank 0. A resume copies the values back from whichever
files cover this rank's fragments (bit-exact; also after a change of world size, elastic resume), and
``avion-ds export --weights ema`` / ``avion-ds eval`` assemble full tensors from the files the same way.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError, Recipe
from avion_ds.distributed import dist
from avion_ds.storage.run_dir import clean_key
from avion_ds.storage.safe_load import load_checkpoint_file

FILE = "ema"  # checkpoint files <FILE>_rank<r>.pt
FILE_PREFIX = f"{FILE}_rank"


@dataclass
class _Slot:
    """One parameter's fragment on this rank: ``ema`` and ``master`` are 1-D fp32 views of the elements
    ``[start, start + numel)`` of the flattened parameter."""

    name: str
    param: torch.nn.Parameter
    shape: tuple[int, ...]
    start: int
    master: torch.Tensor
    ema: torch.Tensor | None = None


def _flat_master_views(optimizer: Any) -> dict[int, torch.Tensor]:
    """id(param) -> its fp32 master under ZeRO-0's bf16 / fp16 wrappers: a slice of ``FP16_Optimizer``'s
    flat ``fp32_groups_flat`` (DeepSpeed's fused optimizers) or ``FP16_UnfusedOptimizer``'s ``fp32_groups``."""
    groups = getattr(optimizer, "fp16_groups", None)
    flats, unfused = getattr(optimizer, "fp32_groups_flat", None), getattr(optimizer, "fp32_groups", None)
    views: dict[int, torch.Tensor] = {}
    if groups is not None and flats is not None:
        for params, flat in zip(groups, flats):
            offset = 0
            for p in params:
                views[id(p)] = flat.narrow(0, offset, p.numel())
                offset += p.numel()
    elif groups is not None and unfused is not None:
        for params, masters in zip(groups, unfused):
            views.update({id(p): m.detach().view(-1) for p, m in zip(params, masters)})
    return views


def _master_slots(engine: Any) -> tuple[list[_Slot], bool]:
    """This rank's fp32 master fragment of every trainable parameter, and whether every rank holds all
    of them (ZeRO-0) rather than a partition (ZeRO-1/2)."""
    flat = _flat_master_views(engine.optimizer)
    slots: list[_Slot] = []
    replicated = True
    for raw, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        name, shape = clean_key(raw), tuple(p.shape)
        if hasattr(p, "ds_id"):
            raise ConfigError("ema.decay > 0 is not supported with ZeRO-3 (set ema.decay=0 or use ZeRO-0/1/2)")
        if hasattr(p, "_hp_mapping"):  # ZeRO-1/2: None when no element of p is in this rank's partition
            replicated = False
            m = p._hp_mapping
            master = m.hp_fragment if m is not None else torch.empty(0, dtype=torch.float32, device=p.device)
            slots.append(_Slot(name, p, shape, m.lp_fragment_address.start if m is not None else 0, master))
        elif id(p) in flat:
            slots.append(_Slot(name, p, shape, 0, flat[id(p)]))
        elif p.dtype == torch.float32:
            slots.append(_Slot(name, p, shape, 0, p.detach().view(-1)))
        else:
            raise ConfigError(
                f"ema.decay > 0: no fp32 master weight found for {name} ({p.dtype}) under "
                f"{type(engine.optimizer).__name__}; use ZeRO-0/1/2 with a DeepSpeed or torch Adam/Lion optimizer"
            )
    return slots, replicated


class WeightEMA:
    """EMA of the engine's fp32 master weights (see the module docstring); ``update()`` after every applied step."""

    def __init__(self, engine: Any, decay: float) -> None:
        self.engine, self.decay, self.updates = engine, float(decay), 0
        self.slots, self.replicated = _master_slots(engine)
        for s in self.slots:
            s.ema = s.master.detach().clone()

    def _relink(self) -> None:
        """Point the slots at the masters again (a checkpoint load may re-link DeepSpeed's fragments)."""
        fresh, _ = _master_slots(self.engine)
        for s, f in zip(self.slots, fresh):
            s.master, s.start = f.master, f.start

    @torch.no_grad()
    def update(self) -> None:
        """``ema = decay * ema + (1 - decay) * master`` for every fragment (timm ``ModelEmaV2``'s rule)."""
        emas = [s.ema for s in self.slots if s.master.numel()]
        masters = [s.master for s in self.slots if s.master.numel()]
        if emas:
            torch._foreach_mul_(emas, self.decay)
            torch._foreach_add_(emas, masters, alpha=1.0 - self.decay)
        self.updates += 1

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any] | None:
        """This rank's file content (None: nothing to write: ZeRO-0's copies are written by rank 0 only)."""
        if self.replicated and dist.rank() != 0:
            return None
        params = {
            s.name: {"shape": list(s.shape), "start": s.start, "value": s.ema.detach().cpu().clone()}
            for s in self.slots
            if s.ema.numel()
        }
        return {"decay": self.decay, "updates": self.updates, "world_size": dist.world_size(), "params": params}

    def load(self, tag_dir: Path, trust: bool = False) -> None:
        """Copy this rank's fragments back from the tag's ``ema_rank*.pt`` files (any world size)."""
        self._relink()
        files = ema_files(tag_dir)
        if not files:
            raise ConfigError(
                f"ema.decay={self.decay:g} but checkpoint {tag_dir} holds no EMA ({FILE_PREFIX}*.pt): it was "
                "written without ema; set ema.decay=0 or start a new output_dir"
            )
        states = [read_ema_file(f, trust) for f in files]
        self.updates = int(states[0].get("updates", 0))
        covered = {s.name: 0 for s in self.slots}
        for state in states:
            for s in self.slots:
                entry = state["params"].get(s.name)
                if entry is not None:
                    covered[s.name] += _copy_overlap(s.ema, s.start, entry)
        short = [s.name for s in self.slots if covered[s.name] < s.ema.numel()]
        if short:
            raise ConfigError(f"checkpoint {tag_dir}: the EMA files lack (part of) {', '.join(short[:4])}")

    # ------------------------------------------------------------------ evaluation
    def _full(self, s: _Slot) -> torch.Tensor:
        """The whole EMA of ``s``'s parameter on its device (a collective across ZeRO-1/2's ranks)."""
        if self.replicated:
            return s.ema.view(s.shape).to(s.param.device)
        buf = torch.zeros(s.param.numel(), dtype=torch.float32, device=s.param.device)
        buf.narrow(0, s.start, s.ema.numel()).copy_(s.ema)
        import deepspeed.comm as ds_comm  # lazy: deepspeed takes seconds to import

        ds_comm.all_reduce(buf, group=getattr(s.param, "_dp_group", None))
        return buf.view(s.shape)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The module holds the EMA weights (in its own dtype) inside the block, its own ones again after
        (restored bit-exactly from a host copy). Every rank must enter it (ZeRO-1/2 gather the EMA)."""
        saved: list[torch.Tensor] = []
        try:
            with torch.no_grad():
                for s in self.slots:
                    full = self._full(s)
                    saved.append(s.param.detach().cpu().clone())
                    s.param.data.copy_(full.to(s.param.dtype))
            yield
        finally:
            with torch.no_grad():
                for s, old in zip(self.slots, saved):
                    s.param.data.copy_(old)


def _copy_overlap(dst: torch.Tensor, start: int, entry: dict[str, Any]) -> int:
    """Copy the part of a file entry (``start``, 1-D ``value``) that overlaps ``dst`` (elements ``[start,
    start + len)`` of the same flattened parameter); returns the number of elements copied."""
    src_start, value = int(entry["start"]), entry["value"]
    lo, hi = max(start, src_start), min(start + dst.numel(), src_start + value.numel())
    if hi <= lo:
        return 0
    dst.narrow(0, lo - start, hi - lo).copy_(value.narrow(0, lo - src_start, hi - lo))
    return hi - lo


FILE_NAME = re.compile(rf"^{FILE_PREFIX}(\d+)\.pt$")


def ema_files(tag_dir: Path) -> list[Path]:
    """The tag's EMA files (``ema_rank<r>.pt`` exactly: a stray ``ema_rank0.bak.pt`` is not ours), by rank."""
    found = [(int(m.group(1)), p) for p in Path(tag_dir).glob(f"{FILE_PREFIX}*.pt") if (m := FILE_NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def _bad_entry(entry: Any) -> str | None:
    """Why a file's parameter entry is not ``{"shape": [ints], "start": int, "value": 1-D float tensor}``
    lying inside that shape, else None."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not a dict"
    shape, start, value = entry.get("shape"), entry.get("start"), entry.get("value")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(n, int) and n >= 0 for n in shape):
        return f"shape {str(shape)[:40]} is not a list of sizes"
    if not isinstance(start, int) or start < 0:
        return f"start {str(start)[:40]} is not an offset"
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or not value.is_floating_point():
        return "value is not a 1-D float tensor"
    if start + value.numel() > math.prod(shape):
        return f"elements [{start}, {start + value.numel()}) lie outside its shape {list(shape)}"
    return None


def read_ema_file(path: Path, trust: bool = False) -> dict[str, Any]:
    """One EMA file through the safe loader, its structure checked: ConfigError naming the file (and the
    parameter) when it is not what ``WeightEMA.state_dict`` writes."""
    state = load_checkpoint_file(path, trust, mmap=True)
    params = state.get("params") if isinstance(state, dict) else None
    why = None if isinstance(params, dict) else "no 'params' mapping"
    if why is None and not isinstance(state.get("updates", 0), int):
        why = "'updates' is not an integer"
    for name, entry in (params or {}).items() if why is None else ():
        reason = _bad_entry(entry)
        if reason:
            why = f"entry {str(name)[:60]}: {reason}"
            break
    if why:
        raise ConfigError(
            f"EMA file {path} is not an avion-ds weight EMA ({why}); move it out of the tag, or use the trained "
            "weights (ema.decay=0 to resume, --set ema.weights=model to evaluate, --weights model to export)"
        )
    return state


class EmaFiles:
    """The EMA files of a checkpoint tag (memory-mapped): names, shapes, and one whole tensor at a time."""

    def __init__(self, tag_dir: Path, trust: bool = False) -> None:
        files = ema_files(tag_dir)
        if not files:
            raise ConfigError(
                f"weights 'ema': checkpoint {tag_dir} holds no EMA ({FILE_PREFIX}*.pt; trained with ema.decay=0)"
            )
        self.states = [read_ema_file(f, trust) for f in files]
        self.shapes = {name: tuple(e["shape"]) for st in self.states for name, e in st["params"].items()}

    def get(self, name: str) -> torch.Tensor:
        """The whole fp32 EMA of parameter ``name`` (clean name)."""
        t = torch.zeros(int(torch.Size(self.shapes[name]).numel()), dtype=torch.float32)
        for st in self.states:
            if name in st["params"]:
                _copy_overlap(t, 0, st["params"][name])
        return t.view(self.shapes[name])


def build(engine: Any, recipe: Recipe) -> WeightEMA | None:
    """The recipe's EMA over ``engine`` (None when ``ema.decay`` is 0)."""
    return WeightEMA(engine, recipe.ema.decay) if recipe.ema.decay > 0 else None


def eval_weights(recipe: Recipe) -> str:
    """Which weights validation, ``avion-ds eval`` of a run directory and ``export`` use: ema | model."""
    return "ema" if recipe.ema.decay > 0 and recipe.ema.weights == "ema" else "model"


@contextlib.contextmanager
def evaluation_weights(averaged: WeightEMA | None, recipe: Recipe, log: Callable[[str], None] = print) -> Iterator[str]:
    """Inside the block the model holds the weights validation uses (``eval_weights``), whose name it yields;
    with an EMA kept, one log line says which (every rank must enter: ZeRO-1/2 gather the EMA)."""
    weights = eval_weights(recipe)
    if averaged is not None:
        log(f"evaluating the {weights} weights (ema.decay={recipe.ema.decay:g}, ema.weights={recipe.ema.weights})")
    with averaged.applied() if averaged is not None and weights == "ema" else contextlib.nullcontext():
        yield weights


def with_ema(sd: dict[str, torch.Tensor], tag_dir: Path, trust: bool = False) -> dict[str, torch.Tensor]:
    """``sd`` (a consolidated state dict, clean names) with the tag's EMA in place of the averaged parameters."""
    files = EmaFiles(tag_dir, trust)
    unknown = sorted(set(files.shapes) - set(sd))
    if unknown:
        raise ConfigError(f"weights 'ema': {', '.join(unknown[:4])} of the EMA not in checkpoint {tag_dir}")
    return {**sd, **{name: files.get(name) for name in files.shapes}}

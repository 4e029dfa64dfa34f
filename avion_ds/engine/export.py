"""`avion-ds export --checkpoint RUN_DIR --out model.safetensors`: ZeRO shards -> one fp32 safetensors state dict.

ZeRO 1/2/3: the fp32 master weights rebuilt from the optimizer shards (``run_dir.zero_state_dict``,
the layout of DeepSpeed's ``zero_to_fp32`` without its full unpickling); ZeRO-0: the module state.
Every file is read with ``weights_only`` + allowlist (``--trust-checkpoint`` opts out). The file
loads with ``create_model(name, pretrained=file)``; its metadata names the model and architecture.
``--weights ema`` writes the run's weight EMA (``ema.decay``; ``engine.ema``) in place of the trained
parameters; the default is the run recipe's ``ema.weights`` (``model`` when it kept no EMA).

The safetensors file is our layout for every model kind (a pretraining run's ``encoder.*`` /
``decoder.*`` / ``encoder_to_decoder`` / ``mask_token``, a dual encoder's ``visual.*`` / ``textual.*``);
other libraries' layouts (``--format hf | open_clip | avion``): :mod:`avion_ds.engine.export_formats`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from avion_ds.distributed.run_log import progress
from avion_ds.engine.ema import EmaFiles, with_ema
from avion_ds.storage.run_dir import (
    MARKER,
    checkpoint_dir,
    clean_key,
    consolidate,
    latest_complete,
    run_zero_stage,
    zero_state_dict,
)
from avion_ds.storage.safetensors_stream import SafetensorsWriter


def stream_export(
    run_dir: Path, tag: str, out: Path, meta: dict[str, str], trust: bool = False, weights: str = "model"
) -> Path:
    """ZeRO 1/2/3 -> safetensors one tensor at a time: the lazy fp32 reconstruction (optimizer shards
    memory-mapped) feeds ``SafetensorsWriter``, so the process holds the mapped fp32 partitions
    (file-backed) plus one tensor, not the full copy of ``consolidate``; ``weights="ema"``: the EMA's
    tensors (assembled one at a time from its memory-mapped files) in place of the trained parameters."""
    tag_dir = checkpoint_dir(run_dir) / tag
    lazy = zero_state_dict(tag_dir, trust)
    averaged = EmaFiles(tag_dir, trust) if weights == "ema" else None
    specs = [
        (clean_key(k), torch.float32 if v.dtype.is_floating_point else v.dtype, tuple(v.shape)) for k, v in lazy.items()
    ]
    writer = SafetensorsWriter(out, specs, meta)
    for (name, dtype, _), v in zip(specs, lazy.values()):
        t = averaged.get(name) if averaged is not None and name in averaged.shapes else v.materialize()
        writer.write(name, t.to(dtype))
        del t
    return writer.close()


def run_weights(run_dir: Path) -> str:
    """The weights a run's recipe names for evaluation and export (``ema.weights`` when it kept an EMA)."""
    path = run_dir / "recipe.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    section = (data or {}).get("ema") or {}
    return "ema" if float(section.get("decay", 0.0) or 0.0) > 0 and section.get("weights", "ema") == "ema" else "model"


def consolidated(run_dir: Path, tag: str | None, trust: bool, weights: str) -> dict[str, torch.Tensor]:
    """``consolidate`` of the tag, with the weight EMA in place of the trained parameters for ``weights="ema"``."""
    sd = consolidate(run_dir, tag, trust)
    return (
        with_ema(sd, checkpoint_dir(run_dir) / (tag or str(latest_complete(run_dir))), trust)
        if weights == "ema"
        else sd
    )


def export(
    run_dir: str | Path, out: str | Path, tag: str | None = None, trust: bool = False, weights: str = "model"
) -> Path:
    """Write the consolidated fp32 weights of ``run_dir`` to ``out`` (safetensors, or .pt); ``weights``:
    model (the trained parameters) | ema (the weight EMA, ``ema.decay``).

    ZeRO 1/2/3 runs exported to .safetensors stream (``stream_export``); other cases consolidate
    in memory first."""
    run_dir = Path(run_dir)
    bar = progress(desc="export (consolidate, write)", total=2, unit="step")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": "avion_ds", "tag": tag or str(latest_complete(run_dir)), "weights": weights}
    ident = run_dir / "run.json"
    if ident.is_file():
        meta["model"] = json.dumps(json.loads(ident.read_text()).get("model", {}))
    resolved = tag or latest_complete(run_dir)
    if (
        out.suffix == ".safetensors"
        and resolved is not None
        and (checkpoint_dir(run_dir) / resolved / MARKER).is_file()
        and run_zero_stage(run_dir, checkpoint_dir(run_dir) / resolved) > 0
    ):
        path = stream_export(run_dir, resolved, out, meta, trust, weights)  # tensor by tensor
        bar.update(2)
        bar.close()
        return path
    sd = consolidated(run_dir, tag, trust, weights)
    bar.update(1)
    if out.suffix == ".safetensors":
        # safetensors refuses shared storage: give every tensor its own contiguous copy
        save_file({k: v.detach().contiguous().clone() for k, v in sd.items()}, str(out), metadata=meta)
    else:
        torch.save({"state_dict": sd, "meta": meta}, out)
    bar.update(1)
    bar.close()
    return out

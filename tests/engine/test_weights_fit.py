"""Start-up (``--dry-run`` included) refuses a ``model.pretrained`` whose tensors do not fit the model,
from the checkpoint's shapes alone: safetensors, a torch pickle (wrapped as ``{"model": ...}``) and a
training run directory; weights that fit (resized where the loader resizes) pass, and no value is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from avion_ds.cli import train
from avion_ds.engine import weights_fit
from avion_ds.models import create_model
from tests.engine import test_train_errors
from tests.engine.test_train_errors import _args, no_process_group

HEADS = {"verb": 4, "noun": 3}
setup = test_train_errors.setup  # the fixture: a tiny EPIC recipe over a manifest (videos never opened)


def _weights(tmp: Path, name: str, kind: str, **kw: object) -> Path:
    sd = {k: v.contiguous() for k, v in create_model(name, heads=HEADS, **kw).state_dict().items()}
    path = tmp / f"{name}.{kind}"
    if kind == "safetensors":
        save_file(sd, str(path))
    else:
        torch.save({"model": sd}, path)
    return path


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
def test_dry_run_refuses_weights_that_do_not_fit(
    kind: str,
    setup: dict,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_process_group(monkeypatch)
    weights = _weights(setup["tmp"], "vit_test_small", kind)  # 96 wide, 4 deep: into the 64-wide tiny model
    code = train.main(_args(setup, "--dry-run", "--set", f"model.pretrained={weights}"))
    out, err = capsys.readouterr()
    assert code == 2 and "all checks passed" not in out, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"avion-ds train: error: model.pretrained={weights}: "), lines
    assert "does not fit" in lines[0]
    assert not (setup["tmp"] / "run").exists()


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
def test_dry_run_passes_weights_that_fit_without_reading_values(
    kind: str,
    setup: dict,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_process_group(monkeypatch)
    weights = _weights(setup["tmp"], "vit_test_tiny", kind, img_size=64)  # pos_embed resized by the loader
    seen: list[str] = []
    real = weights_fit.shape_only
    monkeypatch.setattr(
        weights_fit, "shape_only", lambda *a: seen.extend({v.device.type for v in _flat(real(*a))}) or real(*a)
    )
    code = train.main(_args(setup, "--dry-run", "--set", f"model.pretrained={weights}"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "all checks passed" in out and set(seen) == {"meta"}


def _flat(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    return [t for v in obj.values() for t in _flat(v)] if isinstance(obj, dict) else []


@pytest.mark.multiprocess
def test_run_directory_shapes_are_checked(setup: dict, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    from tests.engine.consolidate_script import save_run
    from tests.helpers import one_rank_vars

    for key, value in one_rank_vars().items():
        monkeypatch.setenv(key, value)
    from avion_ds.distributed import dist

    dist.init()
    run = setup["tmp"] / "clip_run"
    save_run(run, 2, model="clip")  # a dual encoder's run directory: its video tower is 2 frames x 8 px patches
    shapes = weights_fit.shape_only(run, False)
    assert shapes and {v.device.type for v in shapes.values()} == {"meta"} and "logit_scale" in shapes
    no_process_group(monkeypatch)
    code = train.main(_args(setup, "--dry-run", "--set", f"model.pretrained={run}"))
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if "avion-ds" in ln]  # not DeepSpeed's notes
    assert code == 2 and len(err) == 1 and err[0].startswith(f"avion-ds train: error: model.pretrained={run}: "), err

"""EMA files are ours by name (``ema_rank<r>.pt``: a stray ``ema_rank0.bak.pt`` is ignored by resume, eval
and export) and by structure (anything else is one line naming the file, never a traceback)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.engine.ema import EmaFiles, WeightEMA, ema_files, with_ema


def _engine() -> SimpleNamespace:
    """Just enough of an engine for ``WeightEMA``: a ZeRO-0 fp32 module (the EMA follows its parameters)."""
    torch.manual_seed(0)
    return SimpleNamespace(module=torch.nn.Linear(2, 3), optimizer=SimpleNamespace())


def _write(tag: Path, ema: WeightEMA, name: str = "ema_rank0.pt") -> Path:
    tag.mkdir(parents=True, exist_ok=True)
    torch.save(ema.state_dict(), tag / name)
    return tag / name


def test_stray_files_beside_the_ema_files_are_not_ours(tmp_path: Path) -> None:
    engine = _engine()
    ema = WeightEMA(engine, 0.5)
    _write(tmp_path, ema)
    (tmp_path / "ema_rank0.bak.pt").write_bytes(b"not even a pickle")
    (tmp_path / "ema_rank_x.pt").write_bytes(b"")
    assert ema_files(tmp_path) == [tmp_path / "ema_rank0.pt"]
    sd = {k: torch.zeros_like(v) for k, v in engine.module.state_dict().items()}
    got = with_ema(sd, tmp_path)  # eval / export of the EMA weights
    assert torch.equal(got["weight"], engine.module.weight.detach())
    fresh = WeightEMA(_engine(), 0.5)
    fresh.load(tmp_path)  # resume
    assert torch.equal(fresh.slots[0].ema, ema.slots[0].ema)


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ([1, 2], "no 'params' mapping"),
        ({"params": {"weight": [0.0]}}, "entry weight: a list, not a dict"),
        ({"params": {"weight": {"shape": [3, 2], "start": 0}}}, "entry weight: value is not a 1-D float tensor"),
        (
            {"params": {"weight": {"shape": "3x2", "start": 0, "value": torch.zeros(6)}}},
            "entry weight: shape 3x2 is not",
        ),
        (
            {"params": {"weight": {"shape": [3, 2], "start": 4, "value": torch.zeros(6)}}},
            r"entry weight: elements \[4, 10\) lie",
        ),
        ({"params": {}, "updates": "many"}, "'updates' is not an integer"),
    ],
    ids=["list", "entry", "no-value", "shape", "outside", "updates"],
)
def test_an_ema_file_of_the_wrong_structure_is_one_line_naming_it(state: object, why: str, tmp_path: Path) -> None:
    path = tmp_path / "ema_rank0.pt"
    torch.save(state, path)
    for call in (lambda: EmaFiles(tmp_path), lambda: WeightEMA(_engine(), 0.5).load(tmp_path)):
        with pytest.raises(ConfigError, match=rf"^EMA file {path} is not an avion-ds weight EMA \({why}") as info:
            call()
        assert "\n" not in str(info.value)

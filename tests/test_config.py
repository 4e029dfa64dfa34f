"""Recipe loading: typed coercion, unknown keys, dotted overrides, validation, round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from avion_ds.config import ConfigError, Recipe, save_recipe
from avion_ds.tasks import build_recipe, load_recipe


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_defaults_and_types(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        {
            "model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}},
            "optim": {"lr": "3e-4", "betas": [0.9, 0.95]},
            "batch": {"micro_batch": "4"},
        },
    )
    r = load_recipe(p)
    assert isinstance(r, Recipe)
    assert r.optim.lr == pytest.approx(3e-4)
    assert r.optim.betas == [0.9, 0.95]
    assert r.batch.micro_batch == 4 and isinstance(r.batch.micro_batch, int)
    assert r.model.heads == {"verb": 4, "noun": 3}


def test_unknown_key_names_key_and_suggests(tmp_path: Path) -> None:
    p = _write(tmp_path, {"optim": {"lrr": 1e-3}})
    with pytest.raises(ConfigError, match=r"optim\.lrr.*did you mean lr"):
        load_recipe(p)
    with pytest.raises(ConfigError, match="unknown recipe key 'modle'"):
        build_recipe({"modle": {}})


def test_bad_type_names_key() -> None:
    with pytest.raises(ConfigError, match=r"batch\.micro_batch: expected an integer, got 'eight'"):
        build_recipe({"batch": {"micro_batch": "eight"}, "model": {"heads": {"verb": 2}}})


def test_dotted_overrides(tmp_path: Path) -> None:
    p = _write(tmp_path, {"model": {"heads": {"verb": 4, "noun": 3}}})
    r = load_recipe(p, ["optim.lr=1e-3", "data.decoder=pyav", "model.heads={verb: 2}", "schedule.steps_per_epoch=null"])
    assert r.optim.lr == pytest.approx(1e-3)
    assert r.data.decoder == "pyav"
    assert r.model.heads == {"verb": 2}
    assert r.schedule.steps_per_epoch is None
    with pytest.raises(ConfigError, match="not of the form"):
        load_recipe(p, ["optim.lr"])
    with pytest.raises(ConfigError, match=r"optim\.lx"):
        load_recipe(p, ["optim.lx=1"])


def test_choices_and_ranges() -> None:
    base = {"model": {"heads": {"verb": 2}}}
    with pytest.raises(ConfigError, match="data.decoder='opencv' is not one of"):
        build_recipe({**base, "data": {"decoder": "opencv"}})
    with pytest.raises(ConfigError, match="batch.micro_batch=0 must be positive"):
        build_recipe({**base, "batch": {"micro_batch": 0}})
    with pytest.raises(ConfigError, match="needs model.heads"):
        build_recipe({"data": {"dataset": "epic"}})
    with pytest.raises(ConfigError, match="num_frames=15 is not divisible by model.tubelet_size=2"):
        build_recipe({"model": {"heads": {"verb": 2}, "tubelet_size": 2}, "data": {"num_frames": 15}})
    with pytest.raises(ConfigError, match="crop_scale"):
        build_recipe({**base, "data": {"crop_scale": [0.9, 0.1]}})
    with pytest.raises(ConfigError, match=r"optim.lr=1e\+39 overflows float32"):  # finite as a Python float
        build_recipe({**base, "optim": {"lr": 1e39}})
    build_recipe({**base, "optim": {"lr": 3e38}})  # the largest float32 values are still accepted


def test_float32_max_matches_torch() -> None:
    import torch

    from avion_ds.config import FLOAT32_MAX

    assert FLOAT32_MAX == torch.finfo(torch.float32).max


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(bad)


def test_save_round_trip(tmp_path: Path) -> None:
    r = build_recipe({"model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}}, "seed": 7})
    save_recipe(r, tmp_path / "resolved.yaml")
    assert load_recipe(tmp_path / "resolved.yaml") == r

"""Bad input fails before any training work with a one-line error naming the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from avion_ds.engine import train

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def setup(tmp_path: Path) -> dict:
    (tmp_path / "chunks").mkdir()
    (tmp_path / "chunks" / "manifest.jsonl").write_text(  # checks never open the video itself
        '{"video_id": "v0", "path": "v0/0.mp4", "start_frame": 0, "frames": 300, "fps": 30, "width": 64, '
        '"height": 48, "job": 1}\n')
    rows = "".join(f"v0_{i},v0,00:00:0{i}.00,00:00:0{i}.50,{i % 4},{i % 3}\n" for i in range(8))
    for name in ("train.csv", "val.csv"):
        (tmp_path / name).write_text("narration_id,video_id,start_timestamp,stop_timestamp,verb_class,noun_class\n"
                                     + rows)
    recipe = {"model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}},
              "data": {"dataset": "epic", "root": str(tmp_path / "chunks"), "train_csv": str(tmp_path / "train.csv"),
                       "val_csv": str(tmp_path / "val.csv"), "num_frames": 4, "size": 32},
              "batch": {"global_batch": 8, "micro_batch": 4}, "output_dir": str(tmp_path / "run")}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return {"tmp": tmp_path, "recipe": path, "data": recipe}


def _run(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    code = train.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def _args(setup: dict, *extra: str) -> list[str]:
    return ["--config", str(setup["recipe"]), "--deepspeed_config", str(REPO / "ds_configs" / "zero2.json"), *extra]


def test_missing_data_path(setup: dict, capsys: pytest.CaptureFixture) -> None:
    err = _run(capsys, _args(setup, "--set", f"data.val_csv={setup['tmp'] / 'nope.csv'}"))
    assert "data.val_csv" in err and "nope.csv" in err


def test_recipe_key_typo(setup: dict, capsys: pytest.CaptureFixture) -> None:
    err = _run(capsys, _args(setup, "--set", "optim.learning_rate=1e-3"))
    assert "optim.learning_rate" in err


def test_batch_arithmetic(setup: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")  # as a 3-rank launcher would announce
    err = _run(capsys, _args(setup))
    assert "global_batch 8 is not divisible by micro 4 x world 3 = 12" in err


def test_ds_config_not_json(setup: dict, capsys: pytest.CaptureFixture) -> None:
    bad = setup["tmp"] / "bad.json"
    bad.write_text("zero_optimization:\n  stage: 2\n")
    err = _run(capsys, ["--config", str(setup["recipe"]), "--deepspeed_config", str(bad)])
    assert str(bad) in err and "not valid JSON" in err


def test_resume_into_different_models_dir(setup: dict, capsys: pytest.CaptureFixture) -> None:
    run = setup["tmp"] / "run"
    run.mkdir()
    (run / "run.json").write_text('{"model": {"name": "vit_test_small"}}')
    err = _run(capsys, _args(setup))
    assert "different model" in err and "vit_test_small" in err

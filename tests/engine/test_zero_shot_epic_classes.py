"""EPIC-100 zero-shot class sets: a class file with fewer classes than the validation labels use is refused in
one line (file, largest label, class count) instead of scoring labels no prompt exists for; the action classes
say where they come from (LaViLa's preprocess.py: always the train + validation CSVs; here the validation CSV
alone when no train CSV is found, said at start-up, in the report and in the eval line)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

import avion_ds.tasks  # noqa: F401 - registers the tasks
from avion_ds.config import ConfigError, recipe_from_dict
from avion_ds.data.prep.synthetic import make_synthetic_epic
from avion_ds.tasks.zero_shot.task import ZEROSHOT_DEFAULTS, ZeroShotTask, class_sets


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return make_synthetic_epic(
        tmp_path_factory.mktemp("zs_epic") / "s", num_videos=2, segments_per_video=8, width=32, height=24, fps=4
    )


def _recipe(val_csv: Path, class_list: str = ""):
    data = {"val_dataset": "epic", "val_csv": str(val_csv), "class_list": class_list}
    return recipe_from_dict({"task": "zeroshot", "data": data}, ZEROSHOT_DEFAULTS)


def _labels(path: Path, head: str) -> list[int]:
    with path.open(newline="") as f:
        return [int(r[f"{head}_class"]) for r in csv.DictReader(f)]


def _pairs(*paths: Path) -> set[str]:
    out = set()
    for p in paths:
        with p.open(newline="") as f:
            out |= {f"{r['verb_class']}:{r['noun_class']}" for r in csv.DictReader(f)}
    return out


class _Dataset:
    train = False


def test_class_file_shorter_than_the_labels_is_refused(synth: dict, tmp_path: Path) -> None:
    top = max(_labels(Path(synth["val_csv"]), "verb"))
    short = tmp_path / "EPIC_100_verb_classes.csv"
    short.write_text("id,key\n" + "".join(f"{i},verb{i}\n" for i in range(top)))  # ids 0..top-1
    shutil.copy(synth["noun_classes_csv"], tmp_path / "EPIC_100_noun_classes.csv")
    with pytest.raises(ConfigError) as e:
        class_sets(_recipe(synth["val_csv"], str(short)), _Dataset())
    line = str(e.value)
    assert "\n" not in line and str(short) in line, line
    assert f"verb_class {top}" in line and f"{top} verb classes" in line and str(synth["val_csv"]) in line, line


def test_action_classes_from_train_and_val(synth: dict) -> None:
    _, report = class_sets(_recipe(synth["val_csv"]), _Dataset())
    assert report["action_classes_from"] == "train+val"
    assert report["classes"]["action"] == len(_pairs(Path(synth["train_csv"]), Path(synth["val_csv"])))


def test_action_classes_from_val_alone_are_said(synth: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for name in ("val.csv", "EPIC_100_verb_classes.csv", "EPIC_100_noun_classes.csv"):
        shutil.copy(Path(synth["val_csv"]).parent / name, tmp_path / name)
    ds = _Dataset()
    ZeroShotTask().prepare_datasets(_recipe(tmp_path / "val.csv"), ds)
    out = capsys.readouterr().out.strip().splitlines()
    report = ds.zero_shot_report
    assert report["action_classes_from"] == "val only"
    assert report["classes"]["action"] == len(_pairs(tmp_path / "val.csv"))
    assert report["classes"]["action"] < len(_pairs(Path(synth["train_csv"]), Path(synth["val_csv"])))
    lines = [x for x in out if "action classes" in x]
    assert len(lines) == 1 and str(tmp_path / "val.csv") in lines[0] and "train + val" in lines[0], out
    line = ZeroShotTask().eval_line({"action_top1": 1.0}, report)
    assert line.startswith("action_top1=1.00; ") and "validation CSV only" in line

"""Renamed recipe keys: the old spelling works for one release with a one-line deprecation note (once per
process), from YAML and ``--set``; the new key works silently; both given is a one-line error.
``model.checkpoint_*`` (activation checkpointing) became ``model.activation_checkpoint_*``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from avion_ds.cli import train as train_cli
from avion_ds.config import ConfigError, renamed_keys, save_recipe
from avion_ds.config import recipe as recipe_module
from avion_ds.tasks import load_recipe
from tests.test_bad_input_table import no_process_group

BASE = ["data.dataset=kinetics"]
RENAMED = {
    "model.checkpoint_every": ("model.activation_checkpoint_every", 2, "activation_checkpoint_every"),
    "model.checkpoint_first_n": ("model.activation_checkpoint_first_n", 3, "activation_checkpoint_first_n"),
    "model.checkpoint_impl": ("model.activation_checkpoint_impl", "deepspeed", "activation_checkpoint_impl"),
    "model.checkpoint_policy": ("model.activation_checkpoint_policy", "selective", "activation_checkpoint_policy"),
}


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: no deprecation noted yet, rank 0."""
    monkeypatch.setattr(recipe_module, "_NOTED", set())
    monkeypatch.delenv("RANK", raising=False)


def test_the_activation_checkpoint_keys_are_renamed() -> None:
    assert {old: new for old, (new, _, _) in RENAMED.items()}.items() <= renamed_keys().items()


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_key_from_set_works_with_one_deprecation_line(old: str, capsys: pytest.CaptureFixture) -> None:
    new, value, attr = RENAMED[old]
    r = load_recipe(None, [*BASE, f"{old}={value}"])
    assert getattr(r.model, attr) == value
    err = capsys.readouterr().err.strip()
    assert err == f"deprecated: recipe key {old} is now {new} (the old name goes in the next release)", err
    load_recipe(None, [*BASE, f"{old}={value}"])  # once per process
    assert capsys.readouterr().err == ""


def test_old_key_from_yaml_works_and_is_saved_under_the_new_name(tmp_path: Path, capsys) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(
        yaml.safe_dump(
            {"model": {"checkpoint_every": 4, "checkpoint_impl": "deepspeed"}, "data": {"dataset": "kinetics"}}
        )
    )
    r = load_recipe(p)
    assert (r.model.activation_checkpoint_every, r.model.activation_checkpoint_impl) == (4, "deepspeed")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("deprecated: recipe key model.checkpoint_") for line in err), err
    assert "model.checkpoint_every is now model.activation_checkpoint_every" in err[0]
    save_recipe(r, tmp_path / "saved.yaml")
    saved = yaml.safe_load((tmp_path / "saved.yaml").read_text())["model"]
    assert saved["activation_checkpoint_every"] == 4 and not {k for k in saved if k.startswith("checkpoint_")}
    assert load_recipe(tmp_path / "saved.yaml") == r


def test_new_key_works_silently(capsys: pytest.CaptureFixture) -> None:
    r = load_recipe(None, [*BASE, "model.activation_checkpoint_every=5", "model.activation_checkpoint_first_n=2"])
    assert (r.model.activation_checkpoint_every, r.model.activation_checkpoint_first_n) == (5, 2)
    assert capsys.readouterr().err == ""


def test_no_note_on_other_ranks(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("RANK", "1")
    assert load_recipe(None, [*BASE, "model.checkpoint_every=2"]).model.activation_checkpoint_every == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_both_spellings_is_one_line_error(old: str, tmp_path: Path) -> None:
    new, value, _ = RENAMED[old]
    with pytest.raises(ConfigError) as e:
        load_recipe(None, [*BASE, f"{old}={value}", f"{new}={value}"])
    assert str(e.value) == f"{old} and {new} are the same recipe key ({old} is its old name): give only {new}"
    p = tmp_path / "r.yaml"  # the old one in the file, the new one on the command line
    p.write_text(yaml.safe_dump({"model": {old.split(".")[1]: value}, "data": {"dataset": "kinetics"}}))
    with pytest.raises(ConfigError, match=f"^{old} and {new} are the same recipe key"):
        load_recipe(p, [f"{new}={value}"])


def test_both_spellings_on_the_command_line_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    no_process_group(monkeypatch)
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"data": {"dataset": "kinetics"}}))
    argv = ["--config", str(p), "--set", "model.checkpoint_every=2", "--set", "model.activation_checkpoint_every=2"]
    code = train_cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("avion-ds train: error: model.checkpoint_every and model.activation_checkpoint_every")


def test_the_old_names_are_not_fields_any_more() -> None:
    with pytest.raises(AttributeError):
        load_recipe(None, BASE).model.checkpoint_every  # noqa: B018


def test_shipped_recipes_use_the_new_names() -> None:
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "launch" / "recipes").glob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
        old = [f"model.{k}" for k in model if f"model.{k}" in renamed_keys()]
        assert not old, (path.name, old)


# a dataset's keys moved from data.* into the dataset's own section (registered by its module)
DATASET_KEYS = {
    "data.epic_label": ("epic.label", "action", ["data.dataset=epic", "model.heads={action: 5}"]),
    "data.aux_train": ("ego4d.aux_train", ["a.pkl"], ["task=contrastive", "data.dataset=ego4d"]),
    "data.val_sentences": ("epic_mir.val_sentences", "s.csv", ["task=contrastive", "data.val_dataset=epic_mir"]),
    "data.clips_per_video": ("videos.clips_per_video", 3, ["task=pretrain"]),
}


@pytest.mark.parametrize("old", sorted(DATASET_KEYS))
def test_a_dataset_key_keeps_its_data_spelling(old: str, capsys: pytest.CaptureFixture) -> None:
    """``data.val_sentences`` reaches ``epic_mir.val_sentences`` with one deprecation line; the recipe is
    saved under the new name."""
    new, value, sets = DATASET_KEYS[old]
    r = load_recipe(None, [*sets, f"{old}={value}"])
    section, key = new.split(".")
    assert getattr(getattr(r, section), key) == value and key not in r.to_dict()["data"]
    assert r.to_dict()[section][key] == value
    err = capsys.readouterr().err.strip()
    assert err == f"deprecated: recipe key {old} is now {new} (the old name goes in the next release)", err
    with pytest.raises(ConfigError, match=f"^{old} and {new} are the same recipe key"):
        load_recipe(None, [*sets, f"{old}={value}", f"{new}={value}"])

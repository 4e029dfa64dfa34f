"""The dataset registry: a dataset defined outside avion_ds registers (as a spec or a class) and is then
built, summarised, path-checked and head-checked like the built-ins; the unknown-name error is one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from avion_ds.config import ConfigError, DataConfig
from avion_ds.data.datasets.build import (
    build_dataset,
    dataset_names,
    dataset_problem,
    dataset_spec,
    read_annotations,
)
from avion_ds.data.datasets.registry import DatasetSpec, dataset_config, register_dataset, unregister_dataset
from avion_ds.engine import preflight
from avion_ds.tasks import load_recipe
from avion_ds.tasks.finetune.task import check_heads, dataset_heads

BUILT_INS = ("epic", "kinetics", "ssv2", "videos", "ego4d", "epic_mir", "egtea", "charades_ego")


class ToyClips:
    """A dataset in name only: what the factory built, for which split and views."""

    def __init__(self, cfg: DataConfig, split: str, temporal_views: int, spatial_views: int, seed: int) -> None:
        self.cfg, self.split, self.views, self.seed = cfg, split, (temporal_views, spatial_views), seed
        self.rows = Path(cfg.train_csv if split == "train" else cfg.val_csv).read_text().split()

    def __len__(self) -> int:
        return len(self.rows)


def toy_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
    rows = Path(cfg.train_csv if split == "train" else cfg.val_csv).read_text().split()
    return len(rows), {"colour": 1 + max(int(r.split(":")[0]) for r in rows), "shape": 2}


def toy_paths(cfg: DataConfig, split: str) -> None:
    if not (Path(cfg.root) / "palette.txt").is_file():
        raise ConfigError(f"data.root={cfg.root}: no palette.txt (the toy dataset's colours)")


@pytest.fixture()
def toy(tmp_path: Path) -> Iterator[list[str]]:
    (tmp_path / "videos").mkdir()
    for split, rows in (("train", "0:a 2:b 1:c"), ("val", "1:d")):
        (tmp_path / f"{split}.txt").write_text(rows)
    register_dataset(DatasetSpec("toy", ToyClips, toy_summary, heads=("colour", "shape"), check_paths=toy_paths))
    try:
        yield [
            "data.dataset=toy",
            f"data.root={tmp_path / 'videos'}",
            f"data.train_csv={tmp_path / 'train.txt'}",
            f"data.val_csv={tmp_path / 'val.txt'}",
            "data.chunked=false",
            "model.heads={colour: 3, shape: 2}",
        ]
    finally:
        unregister_dataset("toy")
    assert "toy" not in dataset_names()


def test_built_ins_registered_in_order() -> None:
    assert dataset_names()[: len(BUILT_INS)] == BUILT_INS


def test_built_ins_listed_in_order_whatever_is_imported_first() -> None:
    """A script (or another test in the same process) importing one dataset module first still sees the built-ins
    in their order: error messages and the suite's results do not depend on import order."""
    code = (
        "import avion_ds.data.datasets.egocentric, avion_ds.data.datasets.ego4d\n"
        "from avion_ds.data.datasets.build import dataset_names\n"
        "print(','.join(dataset_names()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert tuple(out.strip().split(",")) == BUILT_INS


def test_a_spec_registered_outside_is_built_by_the_factory(toy: list[str]) -> None:
    assert "toy" in dataset_names()
    recipe = load_recipe(None, toy)  # the name check and the fine-tuning heads check ask the registry
    assert dataset_heads(recipe) == ("colour", "shape")
    ds = build_dataset(recipe.data, "val", temporal_views=2, spatial_views=3, seed=7)
    assert isinstance(ds, ToyClips) and (ds.split, ds.views, ds.seed, len(ds)) == ("val", (2, 3), 7, 1)
    assert read_annotations(recipe.data, "train") == (3, {"colour": 3, "shape": 2})
    with pytest.raises(ConfigError, match=r"data.root=.*no palette.txt"):  # the dataset's own path check
        preflight.check_data_paths(recipe)
    (Path(recipe.data.root) / "palette.txt").write_text("red")
    preflight.check_data_paths(recipe)
    assert preflight.check_data_layout(recipe) == {"train": 3, "val": 1}


def test_start_up_checks_labels_against_the_declared_heads(toy: list[str]) -> None:
    recipe = load_recipe(None, [*toy, "model.heads={colour: 2, shape: 2}"])
    with pytest.raises(ConfigError, match=r"data.train_csv has colour labels up to 2 but model.heads.colour=2"):
        preflight.check_data_layout(recipe)
    with pytest.raises(ConfigError, match=r"needs exactly the heads colour, shape"):
        check_heads(load_recipe(None, [*toy, "model.heads={action: 4}"]))


def test_a_class_registers_by_its_declarations(tmp_path: Path) -> None:
    @register_dataset
    class Numbers(ToyClips):
        dataset_name = "numbers"
        dataset_heads = None

        @staticmethod
        def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, int]:
            return 5, 10

    try:
        cfg = DataConfig(dataset="numbers", train_csv=str(tmp_path / "t.txt"))
        Path(cfg.train_csv).write_text("1 2")
        assert isinstance(build_dataset(cfg, "train"), Numbers)
        assert read_annotations(cfg, "train") == (5, 10)
        assert dataset_spec(cfg).label_heads(cfg) is None and dataset_spec(cfg).check_paths is None
        with pytest.raises(ValueError, match="dataset 'numbers' is already registered"):
            register_dataset(DatasetSpec("numbers", ToyClips, toy_summary))
    finally:
        unregister_dataset("numbers")
    with pytest.raises(ValueError, match=r"^data.dataset='numbers' is not one of epic, kinetics"):
        build_dataset(cfg, "train")


def test_a_class_without_declarations_is_refused() -> None:
    with pytest.raises(TypeError, match="needs a dataset_name"):
        register_dataset(ToyClips)


@pytest.mark.parametrize(
    "sets, line",
    [
        (["data.dataset=ucf101"], "data.dataset='ucf101' is not one of " + ", ".join(BUILT_INS)),
        (["data.dataset=kinetic"], "(did you mean kinetics?)"),
        (["data.dataset=kinetics", "data.val_dataset=ssv"], "data.val_dataset='ssv' is not one of epic,"),
    ],
)
def test_unknown_dataset_is_one_line(sets: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(None, sets)
    assert line in str(info.value) and "\n" not in str(info.value)
    assert dataset_problem(DataConfig(dataset="kinetics")) is None


def test_dataset_heads_of_the_built_ins() -> None:
    heads = {name: dataset_spec(DataConfig(dataset=name)).label_heads(dataset_config(name)) for name in BUILT_INS}
    assert heads == {**dict.fromkeys(BUILT_INS), "epic": ("verb", "noun")}
    action = dataset_config("epic", label="action")
    assert dataset_spec(action).label_heads(action) == ("action",)


def test_what_the_tasks_ask_instead_of_a_name() -> None:
    """Label kind, heads key, example heads, eval segments, Kinetics-710 mapping: declared by each built-in."""
    specs = {name: dataset_spec(DataConfig(dataset=name)) for name in BUILT_INS}
    kinds = {name: s.label_kind for name, s in specs.items()}
    assert kinds == {
        **dict.fromkeys(BUILT_INS, "class"),
        "videos": "none",
        "ego4d": "narration",
        "epic_mir": "retrieval",
    }
    assert {n for n, s in specs.items() if s.heads_key} == {"epic"} and specs["epic"].heads_key == "epic.label"
    assert {n for n, s in specs.items() if s.eval_segments} == {"ssv2"}
    assert {n for n, s in specs.items() if s.maps_kinetics710_head} == {"kinetics"}
    action = dataset_config("epic", label="action")
    assert specs["epic"].heads_text(action, ("action",)) == "{action: 3806}"
    assert specs["epic"].heads_text(dataset_config("epic"), ("verb", "noun")) == "{verb: 97, noun: 300}"


def test_declarations_of_a_dataset_registered_outside(toy: list[str]) -> None:
    """An unlabelled dataset registered outside is one pretraining reads and fine-tuning names as such; a
    dataset with heads and no model.heads is one line naming its heads; a label kind is checked."""
    with pytest.raises(ConfigError, match=r"^data.dataset='toy' needs model.heads \(e.g. \{colour: N, shape: N\}\)$"):
        load_recipe(None, [x for x in toy if not x.startswith("model.heads")])
    register_dataset(DatasetSpec("toy_frames", ToyClips, toy_summary, label_kind="none", split_file_optional=True))
    try:
        sets = [*toy[1:], "data.dataset=toy_frames", "model.heads=null"]
        assert load_recipe(None, [*sets, "task=pretrain"]).data.dataset == "toy_frames"
        with pytest.raises(ConfigError, match=r"fine-tuning needs a labelled dataset \(epic, kinetics, ssv2, .*toy\)"):
            load_recipe(None, sets)
    finally:
        unregister_dataset("toy_frames")
    with pytest.raises(ValueError, match="label_kind='text' is not one of"):
        DatasetSpec("bad", ToyClips, toy_summary, label_kind="text")


def test_a_dataset_config_with_its_own_keys_pickles() -> None:
    """Spawned DataLoader workers (CUDA) receive the dataset, so its config (data keys + the dataset's own
    section) must pickle and come back equal."""
    import pickle

    cfg = dataset_config("ego4d", root="r", aux_train=["a.pkl"])
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.aux_train == ["a.pkl"] and isinstance(back, DataConfig)

"""A dataset is one folder: a package written into tmp_path, outside avion_ds, with two recipe keys of its
own (``json_clips.repeat``: each row read that many times, a range; ``json_clips.names``: a class-name file,
checked at start-up by the dataset's ``check_paths``), trained 2 steps with ``avion-ds train --plugin
json_clips_pkg`` and evaluated with ``avion-ds eval --plugin``; a bad value of its key and its missing file
are one line and exit 2. No file of avion_ds is edited and avion_ds never names the dataset or its keys.

This is the worked example of docs/design.md, "Adding a dataset".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_task_plugin_flow import CLI, tree_hash, write_data, write_toy_recipe
from tests.helpers import REPO, engine_env, run_process

pytestmark = pytest.mark.multiprocess
NAMES = ("json_clips_pkg", "json_clips", "JsonClips")  # none of them appears in avion_ds

DATASET = '''"""JSON rows {"clip": path under data.root, "class": int}; its own keys: ``json_clips.repeat`` and
``json_clips.names`` (class names, one a line: the number of classes)."""
import json
from dataclasses import dataclass
from pathlib import Path

from avion_ds.data.datasets.csv_rows import split_csv
from avion_ds.data.datasets.registry import check_file_key, register_dataset
from avion_ds.data.datasets.video_clips import VideoClipDataset


@dataclass
class JsonClipsKeys:
    repeat: int = 1  # each row read this many times per epoch
    names: str = ""  # class names, one a line


def read_rows(path):
    rows = json.loads(Path(path).read_text())
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty JSON list of {{clip, class}} rows")
    return rows


def check_names(cfg, split):
    check_file_key("json_clips.names", cfg.names)


@register_dataset
class JsonClips(VideoClipDataset):
    dataset_name = "json_clips"
    dataset_section = JsonClipsKeys
    section_ranges = {"repeat": (1, None, True, True)}
    check_paths = staticmethod(check_names)

    @staticmethod
    def annotation_summary(cfg, split):
        rows = read_rows(split_csv(cfg, split))
        return len(rows) * cfg.repeat, len(Path(cfg.names).read_text().split())

    def __init__(self, cfg, split, temporal_views=1, spatial_views=1, seed=0, index=None):
        super().__init__(cfg, split, temporal_views, spatial_views, seed, index)
        self.list_path = Path(self._split_file())
        self.rows = read_rows(self.list_path)
        self.num_classes = len(Path(cfg.names).read_text().split())
        self._prune()

    def __len__(self):
        return len(self.rows) * self.cfg.repeat

    def row_ref(self, i):
        return self.rows[i % len(self.rows)]["clip"], True

    def row_where(self, i):
        return self.list_path, i % len(self.rows) + 1

    def row_name(self, i):
        return self.rows[i % len(self.rows)]["clip"]

    def sample_span(self, i):
        row = self.rows[i % len(self.rows)]
        entry = self.index.by_path(row["clip"])
        return entry, 0, entry.num_frames, int(row["class"])
'''


def _recipe(path: Path, data: dict[str, Path], run: Path) -> Path:
    """The task plugin flow's tiny recipe (vit_test_tiny, 3 classes, 4 frames of 32x32, 2 steps of 2 clips),
    fine-tuning on the plugin's dataset with its own section."""
    recipe = yaml.safe_load(write_toy_recipe(path, data, run).read_text())
    del recipe["toy_loss"]
    recipe.update(task="finetune", json_clips={"repeat": 2, "names": str(data["names"])})
    recipe["data"]["dataset"] = "json_clips"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The dataset package, its data (the task plugin flow's six tiny videos) and one 2-step training run."""
    tmp = tmp_path_factory.mktemp("dataset_plugin")
    before = tree_hash(REPO / "avion_ds")
    pkg = tmp / "plugins" / "json_clips_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        '"""A dataset of another package: registers on import."""\nfrom . import dataset\n'
    )
    (pkg / "dataset.py").write_text(DATASET)
    data = write_data(tmp)
    data["names"] = tmp / "names.txt"
    data["names"].write_text("red\ngreen\nblue\n")
    run = tmp / "run"
    recipe = _recipe(tmp / "recipe.yaml", data, run)
    env = engine_env(PYTHONPATH=os.pathsep.join([str(tmp / "plugins"), str(REPO)]))
    train = [*CLI, "train", "--plugin", "json_clips_pkg", "--config", recipe]
    train += ["--deepspeed_config", REPO / "ds_configs" / "zero0.json"]
    proc = run_process(train, env=env, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return {"tmp": tmp, "run": run, "env": env, "train": train, "before": before}


def test_a_plugin_dataset_with_its_own_keys_trains_and_evaluates(plugin_run: dict) -> None:
    run, env = plugin_run["run"], plugin_run["env"]
    rows = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("loss") is not None] == [1, 2], rows
    assert yaml.safe_load((run / "recipe.yaml").read_text())["json_clips"]["repeat"] == 2  # its section is saved
    out = plugin_run["tmp"] / "eval.json"
    proc = run_process([*CLI, "eval", "--plugin", "json_clips_pkg", "--checkpoint", run, "--out", out], env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert result["num_samples"] == 3 * 2, result  # 3 val rows, each read json_clips.repeat = 2 times
    assert tree_hash(REPO / "avion_ds") == plugin_run["before"]  # no file of avion_ds edited
    named = [
        (str(p.relative_to(REPO)), n)
        for p in (REPO / "avion_ds").rglob("*.py")
        if "__pycache__" not in p.parts
        for n in NAMES
        if n in p.read_text(errors="ignore")
    ]
    assert not named, named


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("json_clips.repeat=0", "json_clips.repeat=0 must be >= 1"),
        ("json_clips.names=/nope/names.txt", "json_clips.names: file not found: /nope/names.txt"),
    ],
)
def test_its_bad_key_and_missing_file_are_one_line(plugin_run: dict, override: str, line: str) -> None:
    """Refused before any process group: one line naming the dataset's key, exit 2."""
    cmd = [*plugin_run["train"], "--set", override, "--set", f"output_dir={plugin_run['tmp'] / 'bad'}"]
    proc = run_process(cmd, env=plugin_run["env"], timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and line in err, (proc.stdout[-2000:], err)

"""Recipe sections registered by tasks: reachable from YAML and --set, written back, checked; config
itself holds no task's section or key."""

from __future__ import annotations

import ast
import copy
import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from avion_ds.config import ConfigError, recipe_from_dict, register_section, registered_sections, save_recipe
from avion_ds.config import recipe as recipe_module
from avion_ds.data.datasets.build import dataset_names
from avion_ds.tasks import load_recipe, task_names

ROOT = Path(__file__).resolve().parents[1]
BASE = ["data.dataset=kinetics"]  # a valid recipe otherwise at defaults


@dataclass
class DemoSection:
    """A section as a plugin's task would register it."""

    mode: str = "a"
    ratio: float = 0.5
    steps: int = 3


@pytest.fixture
def demo() -> type:
    """``demo`` registered for one test, then removed."""
    register_section("demo", DemoSection, choices={"mode": ("a", "b")}, ranges={"ratio": (0.0, 1.0, False, False)})
    yield DemoSection
    del recipe_module._SECTIONS["demo"]


def test_registered_section_reads_from_yaml_and_set(demo: type, tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"demo": {"mode": "b", "steps": "7"}, "data": {"dataset": "kinetics"}}))
    r = load_recipe(p, ["demo.ratio=0.25"])
    assert isinstance(r.demo, demo) and (r.demo.mode, r.demo.ratio, r.demo.steps) == ("b", 0.25, 7)
    assert load_recipe(None, BASE).demo == demo()  # defaults when not given


def test_registered_section_is_written_and_reads_back(demo: type, tmp_path: Path) -> None:
    r = load_recipe(None, [*BASE, "demo.mode=b", "pretrain.mask_ratio=0.6"])
    d = r.to_dict()
    assert d["demo"] == {"mode": "b", "ratio": 0.5, "steps": 3} and d["pretrain"]["mask_ratio"] == 0.6
    assert list(d)[:9] == ["model", "data", "optim", "schedule", "batch", "eval", "ema", "checkpoint", "logging"]
    assert "sections" not in d
    save_recipe(r, tmp_path / "recipe.yaml")
    again = load_recipe(tmp_path / "recipe.yaml")
    assert again.demo.mode == "b" and again.pretrain.mask_ratio == 0.6 and again == r


@pytest.mark.parametrize(
    "override, message",
    [
        ("demo.mode=c", "demo.mode='c' is not one of a, b"),
        ("demo.ratio=1.5", "demo.ratio=1.5 must be in (0, 1)"),
        ("demo.ratio=inf", "demo.ratio=inf is not a finite number"),
        ("demo.step=2", "unknown recipe key 'demo.step' (did you mean steps?)"),
        ("dem.mode=a", "unknown recipe key 'dem' (did you mean demo"),
        ("demo.steps=x", "demo.steps: expected an integer"),
        ("sections.demo=1", "unknown recipe key 'sections'"),
    ],
)
def test_registered_section_checks(demo: type, override: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe(None, [*BASE, override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_task_keys_checked_through_their_registration() -> None:
    with pytest.raises(ConfigError, match=r"pretrain\.decoder_mask_type='x' is not one of none, running_cell"):
        load_recipe(None, [*BASE, "pretrain.decoder_mask_type=x"])
    with pytest.raises(ConfigError, match=r"pretrain\.mask_type='x' is not one of tube, random"):
        recipe_from_dict({"pretrain": {"mask_type": "x"}})


def test_registration_refuses_what_would_clash() -> None:
    @dataclass
    class Other:
        mode: str = "a"

    with pytest.raises(ValueError, match="core recipe key"):
        register_section("model", Other)
    with pytest.raises(ValueError, match="already"):
        register_section("pretrain", Other)
    with pytest.raises(TypeError, match="not a dataclass"):
        register_section("plain", dict)
    with pytest.raises(ValueError, match="'nope' is not a field"):
        register_section("other", Other, choices={"nope": ("a",)})
    assert "other" not in registered_sections()


def test_sections_of_the_tasks_are_registered_by_the_tasks() -> None:
    got = {key: s.cls.__module__ for key, s in registered_sections().items()}
    assert got["pretrain"] == "avion_ds.tasks.pretrain.section"
    assert got["contrastive"] == "avion_ds.tasks.contrastive.section"
    assert got["zeroshot"] == "avion_ds.tasks.zero_shot.section"


def test_config_alone_holds_no_task_section() -> None:
    code = "from avion_ds.config import Recipe; print(sorted(Recipe().to_dict()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert not {"pretrain", "contrastive", "zeroshot"} & set(ast.literal_eval(out.stdout))


def test_config_sources_name_no_task_key() -> None:
    """No string in avion_ds/config names a registered section's key (``pretrain.mask_type``) or a task (a
    dataset's section: tests/test_dataset_keys_layers.py)."""
    keys = (set(registered_sections()) - set(dataset_names())) | set(task_names())
    found = []
    for path in sorted((ROOT / "avion_ds" / "config").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if text and (text in keys or ("." in text and text.split(".")[0] in keys)):
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.ClassDef) and any(
                node.name == s.cls.__name__ for s in registered_sections().values()
            ):
                found.append(f"{path.name}:{node.lineno} class {node.name}")
    assert not found, found


def test_config_package_files_are_short() -> None:
    for path in (ROOT / "avion_ds" / "config").glob("*.py"):
        assert len(path.read_text().splitlines()) < 500, path


def test_recipe_copies_keep_the_sections(demo: type) -> None:
    r = load_recipe(None, [*BASE, "demo.mode=b"])
    assert copy.deepcopy(r).demo.mode == "b" and dataclasses.replace(r, seed=1).demo.mode == "b"
    r.demo = demo(mode="a")
    assert r.to_dict()["demo"]["mode"] == "a"

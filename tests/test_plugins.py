"""``--plugin MODULE``: a task (with its own recipe section) of a package outside avion_ds, imported before
the recipe is read by `avion-ds train`, `launch/train.py`, `avion-ds eval` and every other command that
reads a recipe; bad names, missing modules and unknown tasks are one line, exit 2; a recipe cannot name
a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from avion_ds.cli import eval as eval_cli
from avion_ds.cli import train as train_cli
from avion_ds.cli.plugins import import_plugins
from avion_ds.config import ConfigError
from avion_ds.tasks import task_names
from tests.test_bad_input_table import no_process_group

REPO = Path(__file__).resolve().parents[1]
PLUGIN = '''
"""A task of another package: a fine-tuning subclass with a recipe section of its own."""
from dataclasses import dataclass

from avion_ds.config import ConfigError, register_section
from avion_ds.tasks import register_task
from avion_ds.tasks.finetune import FinetuneTask

print("tiny plugin imported", flush=True)


@dataclass
class TinyOptions:
    level: int = 1


register_section("tiny_opts", TinyOptions, ranges={"level": (0, 10, True, True)})


@register_task
class TinyTask(FinetuneTask):
    name = "tiny_plugin"

    def validate_recipe(self, recipe):
        raise ConfigError(f"tiny_plugin validated the recipe: tiny_opts.level={recipe.tiny_opts.level}")
'''


@pytest.fixture()
def plugin(tmp_path: Path) -> dict:
    """The plugin module in tmp_path/plugins, a recipe naming its task, an (empty) weights file."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "tiny_plugin_mod.py").write_text(PLUGIN)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"task": "tiny_plugin", "data": {"dataset": "kinetics"}}))
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugins"), str(REPO)])}
    return {"recipe": recipe, "weights": weights, "env": env, "tmp": tmp_path}


def _run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=600, check=False
    )


@pytest.mark.parametrize(
    "entry",
    [
        ["-m", "avion_ds.cli", "train", "--config", "{recipe}", "--set", "tiny_opts.level=3"],
        ["launch/train.py", "--config", "{recipe}", "--set", "tiny_opts.level=3"],
        [
            "-m",
            "avion_ds.cli",
            "eval",
            "--config",
            "{recipe}",
            "--checkpoint",
            "{weights}",
            "--set",
            "tiny_opts.level=3",
        ],
    ],
    ids=["avion-ds train", "launch/train.py", "avion-ds eval"],
)
def test_plugin_task_and_section_reach_the_recipe(plugin: dict, entry: list[str]) -> None:
    """The plugin is imported before the recipe is read: its section takes --set, its task checks the recipe."""
    argv = [a.format(**plugin) for a in entry]
    done = _run([*argv, "--plugin", "tiny_plugin_mod"], plugin["env"])
    err = done.stderr.strip()
    assert done.returncode == 2, (done.stdout[-2000:], err)
    assert "tiny plugin imported" in done.stdout
    assert err.endswith("error: tiny_plugin validated the recipe: tiny_opts.level=3") and len(err.splitlines()) == 1, (
        err
    )


def test_without_the_plugin_the_task_is_named_and_plugin_suggested(plugin: dict) -> None:
    done = _run(["launch/train.py", "--config", str(plugin["recipe"])], plugin["env"])
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "task='tiny_plugin' is not one of" in err and "--plugin MODULE" in err
    assert "tiny plugin imported" not in done.stdout


def _one_error(capsys: pytest.CaptureFixture, code: int, prog: str) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"avion-ds {prog}: error: "), err
    return err


@pytest.mark.parametrize(
    "name, message",
    [
        ("tiny-plugin.py", "--plugin 'tiny-plugin.py': not a Python module name"),
        ("../tiny", "not a Python module name"),
        ("", "not a Python module name"),
        ("no_such_plugin_module", "--plugin no_such_plugin_module: no module named 'no_such_plugin_module'"),
        ("no_such_pkg.tasks", "no module named 'no_such_pkg'"),
        ("avion_ds.no_such_module", "no module named 'avion_ds.no_such_module'"),
    ],
)
def test_bad_plugin_is_one_line_exit_2(
    name: str, message: str, plugin: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_process_group(monkeypatch)
    code = train_cli.main(["--config", str(plugin["recipe"]), "--plugin", name])
    assert message in _one_error(capsys, code, "train")
    code = eval_cli.main(["--config", str(plugin["recipe"]), "--checkpoint", str(plugin["weights"]), "--plugin", name])
    assert message in _one_error(capsys, code, "eval")


@pytest.mark.parametrize(
    "prog, argv",
    [
        ("export", ["--checkpoint", "{tmp}", "--format", "hf", "--out", "{tmp}/hf"]),
        ("check", ["--config", "{recipe}"]),
        ("bench-loader", ["--config", "{recipe}"]),
        ("reconstruct", ["--checkpoint", "{tmp}", "--video", "{weights}", "--out", "{tmp}/g.png"]),
        ("embed", ["--text", "cut", "--checkpoint", "{tmp}", "--out", "{tmp}/q.safetensors"]),
        ("search", ["cut", "--index", "{tmp}"]),
    ],
)
def test_every_command_reading_a_recipe_imports_plugins_first(
    prog: str, argv: list[str], plugin: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--plugin on the other commands that read a recipe: imported before anything else is checked (a bad
    one is the first error, one line, exit 2), a good one is imported (tests/e2e/test_task_plugin_flow.py
    exports and checks a plugin task's run)."""
    import importlib

    no_process_group(monkeypatch)
    main = importlib.import_module(f"avion_ds.cli.{prog.replace('-', '_')}").main
    args = [a.format(**plugin) for a in argv]
    code = main([*args, "--plugin", "no_such_plugin_module"])
    assert "--plugin no_such_plugin_module: no module named" in _one_error(capsys, code, prog)
    (plugin["tmp"] / "plugins" / "probe_plugin_mod.py").write_text("print('probe plugin imported')\n")
    monkeypatch.syspath_prepend(str(plugin["tmp"] / "plugins"))
    try:
        main([*args, "--plugin", "probe_plugin_mod"])
    finally:
        sys.modules.pop("probe_plugin_mod", None)
    assert "probe plugin imported" in capsys.readouterr().out


def test_a_plugin_whose_import_lacks_a_module_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_more.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^--plugin needs_more: importing it failed: No module named 'not_inst"):
        import_plugins(["needs_more"])


def test_a_recipe_cannot_name_a_plugin(plugin: dict, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    """Only the command line names plugins: a recipe key for it is unknown, and nothing is imported."""
    no_process_group(monkeypatch)
    for key in ("plugin", "plugins"):
        recipe = plugin["tmp"] / f"{key}.yaml"
        recipe.write_text(yaml.safe_dump({key: ["tiny_plugin_mod"], "data": {"dataset": "kinetics"}}))
        monkeypatch.setenv("PYTHONPATH", plugin["env"]["PYTHONPATH"])
        err = _one_error(capsys, train_cli.main(["--config", str(recipe)]), "train")
        assert f"unknown recipe key {key!r}" in err
        assert "tiny_plugin_mod" not in sys.modules and "tiny_plugin" not in task_names()


def test_decoder_plugins_come_from_the_users_environment_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one environment variable that imports code is named where plugins are documented (the code and
    the docs agree), and it is the only one: no other ``AVION_DS_*`` variable leads to an import."""
    import re

    from avion_ds.cli import plugins
    from avion_ds.data.decode import base

    assert base.PLUGINS_ENV in (plugins.__doc__ or "")
    for doc in ("docs/design.md", "docs/data.md"):
        assert base.PLUGINS_ENV in (REPO / doc).read_text(), doc
    assert "never a recipe, a run directory or an environment variable" not in (REPO / "docs/design.md").read_text()
    (tmp_path / "my_decoder.py").write_text(
        "from avion_ds.data.decode.base import register_backend, Decoder\nregister_backend('mine', Decoder)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(base.PLUGINS_ENV, "my_decoder")
    base.load_plugins()
    assert "mine" in base.REGISTRY
    base.REGISTRY.pop("mine")
    sources = "\n".join(p.read_text() for p in (REPO / "avion_ds").rglob("*.py"))
    assert set(re.findall(r"AVION_DS_\w*PLUGIN\w*", sources)) == {base.PLUGINS_ENV}

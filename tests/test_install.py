"""`.ci/install.sh` points the install at ITS checkout, as console scripts and subprocesses see it.

Two copies of the repository (a, b) and a throwaway venv on the system's packages: a is installed
editable; from b's root a plain ``python -c`` check sees b (the current directory is first on
``sys.path``) although from ``/`` the venv resolves a, which is what ``avion-ds`` and deepspeed's
subprocesses run. b's install.sh must notice from outside the tree and re-install: afterwards ``/``
resolves b. Nothing outside tmp_path is installed into.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import REPO

pytestmark = pytest.mark.multiprocess  # a venv, two editable installs, torch imported a few times (~30 s)
TREE = ("avion_ds", ".ci", "pyproject.toml", "setup.cfg", "README.md")
WHERE = "import avion_ds, pathlib; print(pathlib.Path(avion_ds.__file__).resolve().parents[1])"


def _copy(dst: Path) -> Path:
    for name in TREE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400, check=False)


def test_install_sh_reinstalls_when_another_clone_is_installed(tmp_path: Path) -> None:
    a, b = _copy(tmp_path / "a"), _copy(tmp_path / "b")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PIP_NO_INDEX"] = "1"  # nothing is downloaded: the system's packages serve
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", tmp_path / "venv"], check=True
    )
    py = str(tmp_path / "venv" / "bin" / "python")
    proc = _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(a)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _run([py, "-c", WHERE], Path("/"), env).stdout.strip() == str(a.resolve())
    assert _run([py, "-c", WHERE], b, env).stdout.strip() == str(b.resolve())  # what the old in-tree check saw

    proc = _run(["bash", str(b / ".ci" / "install.sh")], tmp_path, {**env, "PYTHON": py})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _run([py, "-c", WHERE], Path("/"), env).stdout.strip() == str(b.resolve())
    assert f"avion_ds ready: {b.resolve() / 'avion_ds' / '__init__.py'}" in proc.stdout
    script = _run([str(tmp_path / "venv" / "bin" / "avion-ds"), "models", "vit_test_tiny"], Path("/"), env)
    assert script.returncode == 0 and "vit_test_tiny" in script.stdout, script.stderr[-2000:]

"""A command a test runs that times out says where it hung before it is ended: ``run_process`` writes each
process of its tree (pid, state, command line, and the Python stacks where py-spy is installed) and the
output's tail to stderr, which pytest shows with the failure."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers.launch import run_process

CHILD = """import os, time
def waits_here():
    os.write(1, b"child started\\n")  # one write: the two children's lines never interleave
    time.sleep(120)
waits_here()
"""


def test_a_timed_out_command_names_its_processes_and_stacks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cmd = ["bash", "-c", f"{sys.executable} {script} & {sys.executable} {script}; wait"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_process(cmd, timeout=4, cwd=tmp_path, merge_stderr=True)  # the children start in ~0.1 s
    err = capsys.readouterr().err
    assert "interrupted (TimeoutExpired); its processes:" in err, err
    assert err.count(f"{sys.executable} {script}") >= 2, err  # both children of the bash, named
    assert err.split("its output's tail:\n")[1].startswith("child started\nchild started\n"), err
    assert not [p for p in psutil.Process().children(recursive=True) if str(script) in " ".join(p.cmdline())]
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed: the report names the processes without their stacks")
    if "Permission denied" in err or "ptrace" in err.lower():
        pytest.skip("py-spy may not attach here (ptrace not permitted): the processes are named, not their stacks")
    assert err.count("waits_here") >= 2, err

"""Running DeepSpeed jobs from a test: one process, or CPU ranks under the deepspeed launcher or torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from avion_ds.distributed.dist import free_port
from tests.helpers.env import REPO, engine_env
from tests.helpers.reaper import kill_tree, tree_report

LAUNCHERS = ("deepspeed", "torchrun", "python")
JOBS_SCRIPT = Path(__file__).with_name("train_jobs.py")
JOB_DONE = "job done in "


def run_process(
    cmd: Sequence[str | Path],
    timeout: int = 300,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    *,
    merge_stderr: bool = False,
) -> subprocess.CompletedProcess:
    """``cmd`` in ``engine_env()`` (or ``env``) from the repo root, output captured as text (stderr into
    stdout with ``merge_stderr``, stderr then ""). A non-zero exit is returned, not raised: the tests
    assert on the code and show the output's tail. Interrupted (its timeout, pytest-timeout, Ctrl-C), it ends the command's
    whole process tree (launcher and ranks) before raising; on a timeout it first writes what each of those
    processes was doing (``tree_report``) and then the output's tail to stderr, which pytest shows."""
    err = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    args = [str(c) for c in cmd]
    env = engine_env() if env is None else env
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
        try:
            out, errs = proc.communicate(timeout=timeout)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                kill_tree(proc.pid)
                raise
            # a timeout (its own, pytest-timeout's): say where it hung, end it, then show what it printed
            sys.stderr.write(f"{' '.join(args[:6])}: interrupted ({type(e).__name__}); its processes:\n")
            sys.stderr.write(tree_report(proc.pid))
            kill_tree(proc.pid)
            try:
                tail = (proc.communicate(timeout=10)[0] or "")[-4000:]
            except subprocess.TimeoutExpired:  # something outside the tree still holds the pipe
                tail = "(the output pipe stayed open)"
            sys.stderr.write(f"its output's tail:\n{tail}\n")
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, "" if merge_stderr else errs)


def launch(
    args: Sequence[str | Path],
    nprocs: int = 2,
    timeout: int = 600,
    launcher: str = "torchrun",
    script_path: Path | None = None,
    *,
    module: str | None = None,
    port: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess:
    """Run ``launch/train.py`` (or ``script_path``, or ``python -m module``) with ``args`` on ``nprocs`` CPU
    ranks (gloo): ``launcher`` is "torchrun" (the default: one process fewer to start than DeepSpeed's
    runner, which re-imports DeepSpeed in its own launch process: 2.4 s vs 7.2 s for two no-op ranks on the
    2-core VM), "deepspeed" (its runner, as the README's commands: the tests of that path ask for it), or
    "python" (one plain process, ``nprocs`` 1). ``port``: the rendezvous port (a free one by default)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if launcher == "python" and nprocs != 1:
        raise ValueError(f"launcher 'python' runs one process, got nprocs={nprocs}")
    if module is not None and script_path is not None:
        raise ValueError("give script_path or module, not both")
    target = ["-m", module] if module else [str(script_path or REPO / "launch" / "train.py")]
    if launcher == "python":
        prefix = [sys.executable]
    else:
        port = free_port() if port is None else port
        if launcher == "deepspeed":
            prefix = [
                sys.executable,
                "-m",
                "deepspeed.launcher.runner",
                "--num_gpus",
                str(nprocs),
                "--master_port",
                str(port),
            ]
            target = ["--module", module] if module else target
        else:
            prefix = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(nprocs),
                "--master_port",
                str(port),
            ]
    return run_process([*prefix, *target, *args], timeout=timeout, env=env, cwd=cwd)


def launch_jobs(
    jobs: Sequence[Sequence[str | Path]], path: Path, nprocs: int = 2, launcher: str = "torchrun", timeout: int = 900
) -> list[str]:
    """Several ``avion-ds train`` jobs (argv lists, run in order) in ONE launch of ``tests/helpers/train_jobs.py``:
    the launcher and the ranks start once for all of them. ``path``: the jobs file to write. Asserts exit 0;
    returns each job's output (:func:`job_logs`), the launch's stderr appended to the last."""
    path.write_text(json.dumps([[str(a) for a in job] for job in jobs]))
    proc = launch([path], nprocs=nprocs, launcher=launcher, script_path=JOBS_SCRIPT, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    logs = job_logs(proc.stdout)
    assert len(logs) == len(jobs), (len(logs), len(jobs), proc.stdout[-3000:])
    logs[-1] += proc.stderr
    return logs


def job_logs(stdout: str) -> list[str]:
    """A ``train_jobs.py`` launch's stdout cut into its jobs' parts (rank 0 ends each with a ``job done in`` line;
    the other ranks' lines fall into the part they were printed during)."""
    parts, current = [], []
    for line in stdout.splitlines(keepends=True):
        current.append(line)
        if line.startswith(JOB_DONE):
            parts.append("".join(current))
            current = []
    return parts

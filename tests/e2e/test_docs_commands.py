"""The documented commands work as written: every ```bash block of README.md and docs/*.md is marked
(``tests/e2e/doc_blocks.py``: cpu / gpu / data / manual), and the ``cpu`` ones run at toy size, exit 0,
and print the figures the doc quotes within their stated tolerance.

A block that uses what another block made names it in ``NEEDS`` (``tests/e2e/conftest.py``); the blocks of
one chain run in order in one scratch directory, on one pytest-xdist worker (their run group), and
independent chains run on both workers. Each scratch directory links ``launch/``, ``ds_configs/`` and
``.ci/`` of this checkout and, for the blocks that train, holds the demo's synthetic data (``demo/synth``,
``demo/chunks``, made once per worker, as ``launch/demo.sh`` makes them), so the doc's relative paths
resolve; this checkout is first on ``PYTHONPATH`` for ``avion-ds``, ``deepspeed`` and ``python``; each
deepspeed launcher line gets a port of its own (``on_own_port``).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from tests.e2e.conftest import CONTRASTIVE, DOCS, DocRuns, doc_block, run_group
from tests.e2e.doc_blocks import Block, blocks, on_own_port, parse_marker, with_sets
from tests.helpers.env import REPO

ALL = [b for path in DOCS for b in blocks(path)]
RUN = [b for b in ALL if b.kind == "cpu"]


def test_every_bash_block_is_marked() -> None:
    unmarked = [b.id for b in ALL if b.kind is None]
    assert not unmarked, f"```bash blocks without a <!-- doc-test: KIND --> line before them: {unmarked}"
    assert RUN, "no cpu block found"


def test_marker_syntax() -> None:
    kind, multi, sets, expects = parse_marker(
        'cpu multiprocess set="schedule.epochs=1 data.workers=0" expect="top-1 +([0-9.]+)%"~94.8+-20 expect="done"'
    )
    assert (kind, multi, sets) == ("cpu", True, ["schedule.epochs=1", "data.workers=0"])
    assert [(e.pattern, e.value, e.tol) for e in expects] == [("top-1 +([0-9.]+)%", 94.8, 20.0), ("done", None, 0.0)]
    with pytest.raises(ValueError, match="kind 'cuda'"):
        parse_marker("cuda")
    with pytest.raises(ValueError, match="unknown words"):
        parse_marker("cpu fast")
    text = "deepspeed --num_gpus 2 launch/train.py --config r.yaml \\\n    --deepspeed_config z.json  # train\nls"
    assert (
        with_sets(text, ["a=1"])
        == "deepspeed --num_gpus 2 launch/train.py --config r.yaml --deepspeed_config z.json --set a=1  # train\nls"
    )


def test_launcher_lines_get_their_own_port() -> None:
    text = "deepspeed --num_gpus 2 launch/train.py --config r.yaml\n  deepspeed --master_port 9 x.py\npython -m deepspeed.x"
    assert on_own_port(text) == (
        'deepspeed --master_port "$MASTER_PORT" --num_gpus 2 launch/train.py --config r.yaml\n'
        "  deepspeed --master_port 9 x.py\npython -m deepspeed.x"
    )


# what every training block's directory holds (the demo data) or only names as a default it overrides
SHARED_BY_ALL = {"demo/synth", "demo/chunks", "demo/run"}


def _demo_paths(b: Block) -> set[str]:
    """The ``demo/`` paths a block names, in its text or in the recipes it names."""
    text = b.text + "".join((REPO / r).read_text() for r in re.findall(r"launch/recipes/[\w.-]+\.ya?ml", b.text))
    return set(re.findall(r"(?<![\w/])demo/[\w.-]+", text)) - SHARED_BY_ALL


def test_blocks_naming_one_path_share_a_run_group() -> None:
    """A block that uses another block's output runs after it in its scratch directory only if ``NEEDS``
    says so: two blocks naming the same ``demo/`` path are in one run group."""
    owner: dict[str, Block] = {}
    for b in RUN:
        for path in sorted(_demo_paths(b)):
            first = owner.setdefault(path, b)
            assert run_group(b) == run_group(first), (
                f"{b.id} and {first.id} both name {path} but run in different scratch directories: "
                "name the block it uses in NEEDS (tests/e2e/conftest.py)"
            )


def _doc_runs_item(block: Block | None = None, mark: object = None) -> object:
    """What ``worker_group`` reads of a test that uses ``doc_runs``: parametrized with ``block``, or marked."""
    fixture = SimpleNamespace(argname="doc_runs", scope="session")
    return SimpleNamespace(
        nodeid="tests/e2e/test_x.py::test_x",
        _fixtureinfo=SimpleNamespace(name2fixturedefs={"doc_runs": [fixture]}),
        get_closest_marker=lambda name: mark if name == "doc_run" else None,
        callspec=SimpleNamespace(params={"block": block}) if block else None,
    )


def test_worker_group_of_documented_runs() -> None:
    """A block and the flows that read its run share its chain's xdist group; other chains have their own; a
    test that uses ``doc_runs`` without naming its run is refused at collection."""
    from tests.conftest import worker_group

    umt = doc_block("pretraining.md", "umt_demo_cpu.yaml")
    contrastive = worker_group(_doc_runs_item(mark=pytest.mark.doc_run(*CONTRASTIVE).mark))
    assert contrastive == worker_group(_doc_runs_item(umt)) == run_group(doc_block(*CONTRASTIVE))
    readme = worker_group(_doc_runs_item(mark=pytest.mark.doc_run("README.md", "launch/demo.sh").mark))
    assert readme == worker_group(_doc_runs_item(doc_block("README.md", "launch/demo.sh"))) != contrastive
    with pytest.raises(pytest.UsageError, match="mark it @pytest.mark.doc_run"):
        worker_group(_doc_runs_item())


def _param(b: Block) -> object:
    return pytest.param(b, id=b.id, marks=[pytest.mark.multiprocess] if b.multiprocess else [])


@pytest.mark.parametrize("block", [_param(b) for b in RUN])
def test_cpu_block_runs_as_written(block: Block, doc_runs: DocRuns) -> None:
    proc = doc_runs.run(block)
    out = proc.stdout
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{out[-4000:]}"
    for e in block.expects:
        m = re.search(e.pattern, out, re.MULTILINE)
        assert m, f"{block.id}: output lacks {e.pattern!r}:\n{out[-3000:]}"
        if e.value is not None:
            got = float(m.group(1))
            assert abs(got - e.value) <= e.tol, (
                f"{block.id}: {e.pattern!r} gave {got}, the doc says {e.value} +- {e.tol}"
            )

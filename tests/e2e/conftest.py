"""The documented commands' scratch directory and their runs, shared by the doc test and the end-to-end
flows: a flow that checks a documented run (the video-text pretraining of docs/video_text.md) reads that
block's run instead of training its own, and each block runs once per session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.doc_blocks import Block, blocks, with_sets
from tests.helpers.env import REPO, engine_env
from tests.helpers.launch import run_process

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEMO_DATA = (
    "avion-ds synth demo/synth --num-videos 16 --segments-per-video 24 --seed 0\n"
    "avion-ds chunk demo/synth/videos demo/chunks --chunk-seconds 15 --short-side 72 --fps 15 --gop 15 "
    "--workers 2 --no-progress\n"
)


# a block that uses what another file's block makes -> that block (doc, needle), run first when not yet run
# (the files run in name order, so a later file's block must be named here)
NEEDS: dict[tuple[str, str], tuple[str, str]] = {
    ("pretraining.md", "umt_demo_cpu.yaml"): ("video_text.md", "contrastive_demo_cpu.yaml"),  # its teacher
}


def doc_block(doc: str, needle: str) -> Block:
    """The cpu block of ``doc`` (a file name under README.md / docs/) whose text contains ``needle``."""
    found = [b for path in DOCS if path.name == doc for b in blocks(path) if b.kind == "cpu" and needle in b.text]
    assert len(found) == 1, f"{doc}: {len(found)} cpu blocks contain {needle!r}"
    return found[0]


def bash(text: str, cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """``text`` under ``bash -euo pipefail``; interrupted, its whole process tree ends (``run_process``)."""
    return run_process(["bash", "-c", f"set -euo pipefail\n{text}\n"], timeout, env, cwd, merge_stderr=True)


class DocRuns:
    """Runs documented blocks in the scratch directory, each once: the doc test and the flows share the
    output (``root``: the scratch directory, where the blocks' relative paths resolve)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def demo_data(self) -> None:
        """The demo's synthetic data (``demo/synth``, ``demo/chunks``), made once as launch/demo.sh makes it."""
        if not (self.root / "demo" / "chunks" / "manifest.jsonl").is_file():
            proc = bash(DEMO_DATA, self.root, self.env, timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:]

    def run(self, block: Block) -> subprocess.CompletedProcess:
        """The block's run at its marker's toy size (run now unless it ran already)."""
        for (doc, needle), first in NEEDS.items():
            if block.path.name == doc and needle in block.text:
                dep = self.run(doc_block(*first))
                assert dep.returncode == 0, (
                    f"{block.id} needs {doc_block(*first).id}, which failed:\n{dep.stdout[-3000:]}"
                )
        if block.id not in self._done:
            if block.multiprocess and "launch/demo.sh" not in block.text:  # the demo makes its data itself
                self.demo_data()
            env = {**self.env, "PATH": os.environ["PATH"]}
            self._done[block.id] = bash(with_sets(block.text, block.sets), self.root, env, timeout=900)
        return self._done[block.id]


@pytest.fixture(scope="session")
def doc_runs(tmp_path_factory: pytest.TempPathFactory) -> DocRuns:
    """The scratch directory the blocks run in (links to launch/, ds_configs/, .ci/) and its runs."""
    root = tmp_path_factory.mktemp("docs")
    for name in ("launch", "ds_configs", ".ci"):
        (root / name).symlink_to(REPO / name)
    return DocRuns(root, engine_env(OMP_NUM_THREADS="1"))

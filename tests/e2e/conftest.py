"""The documented commands' scratch directories and their runs, shared by the doc test and the end-to-end
flows: a flow that checks a documented run (the video-text pretraining of docs/video_text.md) reads that
block's run instead of training its own, and each block runs once per session.

A block that uses what another block made names it in ``NEEDS``; the blocks of one ``NEEDS`` chain (and the
flows that read them) form one run group: one scratch directory, one pytest-xdist worker (``run_group``,
tests/conftest.py: ``worker_group``), so independent chains run on both workers and each block still runs
once. A group's directory holds only what its own chain made, so an undeclared dependency fails every time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from avion_ds.distributed.dist import free_port
from tests.e2e.doc_blocks import Block, blocks, on_own_port, with_sets
from tests.helpers.env import REPO, engine_env
from tests.helpers.launch import run_process

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEMO_DATA = (
    "avion-ds synth demo/synth --num-videos 16 --segments-per-video 24 --seed 0\n"
    "avion-ds chunk demo/synth/videos demo/chunks --chunk-seconds 15 --short-side 72 --fps 15 --gop 15 "
    "--workers 2 --no-progress\n"
)
LINKS = ("launch", "ds_configs", ".ci")  # of this checkout, in every scratch directory

CONTRASTIVE = ("video_text.md", "contrastive_demo_cpu.yaml")
# a block that uses what another block made (its run directory, its outputs; read by the block's commands or
# by the recipe it names) -> that block (doc, needle): run first, in the same scratch directory and worker
NEEDS: dict[tuple[str, str], tuple[str, str]] = {
    ("pretraining.md", "umt_demo_cpu.yaml"): CONTRASTIVE,  # the recipe's teacher: demo/contrastive
    ("training.md", "ds_to_universal"): ("pretraining.md", "pretrain_demo_cpu.yaml"),  # demo/from_pretrain
    ("video_text.md", "output_dir=demo/tower_cls"): CONTRASTIVE,  # model.pretrained=demo/contrastive
    ("video_text.md", "lavila_vit_b_epic_cls.yaml"): CONTRASTIVE,  # demo/contrastive, demo/synth_text
    ("video_text.md", "mir_demo_cpu.yaml"): CONTRASTIVE,  # the recipe's demo/contrastive, demo/synth_text
    ("zero_shot.md", "task=zeroshot"): CONTRASTIVE,  # demo/contrastive, demo/synth_text
    ("zero_shot.md", "avion-ds embed"): CONTRASTIVE,  # demo/contrastive, demo/chunks_text
}


def doc_block(doc: str, needle: str) -> Block:
    """The cpu block of ``doc`` (a file name under README.md / docs/) whose text contains ``needle``."""
    found = [b for path in DOCS if path.name == doc for b in blocks(path) if b.kind == "cpu" and needle in b.text]
    assert len(found) == 1, f"{doc}: {len(found)} cpu blocks contain {needle!r}"
    return found[0]


def needed(block: Block) -> Block | None:
    """The block ``block`` needs run first (``NEEDS``), or None."""
    found = [doc_block(*dep) for (doc, needle), dep in NEEDS.items() if block.path.name == doc and needle in block.text]
    assert len(found) <= 1, f"{block.id}: several NEEDS entries match it: {[b.id for b in found]}"
    return found[0] if found else None


def run_group(block: Block) -> str:
    """The run group of ``block``: the first block of its ``NEEDS`` chain names the group, its scratch
    directory and its pytest-xdist group."""
    while (dep := needed(block)) is not None:
        block = dep
    return "doc-run:" + block.id


def bash(text: str, cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """``text`` under ``bash -euo pipefail``; interrupted, its whole process tree ends (``run_process``)."""
    return run_process(["bash", "-c", f"set -euo pipefail\n{text}\n"], timeout, env, cwd, merge_stderr=True)


class DocRuns:
    """Runs documented blocks, each once, in its run group's scratch directory (``dir``): the doc test and
    the flows share the output."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base, self.env = base, env
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def dir(self, block: Block) -> Path:
        """The scratch directory of ``block``'s run group, where the blocks' relative paths resolve (made on
        first use, with links to launch/, ds_configs/, .ci/ of this checkout)."""
        root = self.base / re.sub(r"[^\w.-]", "_", run_group(block))
        if not root.is_dir():
            root.mkdir()
            for name in LINKS:
                (root / name).symlink_to(REPO / name)
        return root

    def demo_data(self, root: Path) -> None:
        """The demo's synthetic data in ``root`` (``demo/synth``, ``demo/chunks``), made once per worker as
        launch/demo.sh makes it, then copied (mtimes kept, as the chunk manifest records them)."""
        made = self.base / "demo_data"
        if not (made / "demo" / "chunks" / "manifest.jsonl").is_file():
            made.mkdir(exist_ok=True)
            proc = bash(DEMO_DATA, made, self.env, timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:]
        if not (root / "demo" / "chunks" / "manifest.jsonl").is_file():
            shutil.copytree(made / "demo", root / "demo", dirs_exist_ok=True)

    def run(self, block: Block) -> subprocess.CompletedProcess:
        """The block's run at its marker's toy size (run now unless it ran already), after the block it needs;
        launcher lines on a port of their own (``on_own_port``: the other worker runs blocks too)."""
        dep = needed(block)
        if dep is not None:
            proc = self.run(dep)
            assert proc.returncode == 0, f"{block.id} needs {dep.id}, which failed:\n{proc.stdout[-3000:]}"
        if block.id not in self._done:
            root = self.dir(block)
            if block.multiprocess and "launch/demo.sh" not in block.text:  # the demo makes its data itself
                self.demo_data(root)
            env = {**self.env, "PATH": os.environ["PATH"], "MASTER_PORT": str(free_port())}
            self._done[block.id] = bash(on_own_port(with_sets(block.text, block.sets)), root, env, timeout=600)
        return self._done[block.id]


@pytest.fixture(scope="session")
def doc_runs(tmp_path_factory: pytest.TempPathFactory) -> DocRuns:
    """The runs of the documented blocks, under one directory per worker (a scratch directory per run group)."""
    return DocRuns(tmp_path_factory.mktemp("docs"), engine_env(OMP_NUM_THREADS="1"))

"""The command blocks of README.md and docs/*.md, with the marker that says how the docs test runs them.

Every ```bash block carries a marker on the line before it (an HTML comment, invisible when rendered)::

    <!-- doc-test: cpu multiprocess set="schedule.epochs=1" expect="top-1 +([0-9.]+)"~94.8+-20 -->

* kind: ``cpu`` (run, at toy size), ``gpu`` / ``data`` (needs a GPU or a real dataset: not run), ``manual``
  (installs or runs the suite itself: not run);
* ``multiprocess``: the block launches DeepSpeed ranks or trains (the test is marked so);
* ``set="K=V K=V"``: ``--set K=V`` appended to every recipe-taking command of the block (toy size);
* ``expect="REGEX"``: the block's output matches REGEX; with ``~VALUE+-TOL`` its first group is a number
  within TOL of VALUE (a figure the doc quotes). Repeatable.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("cpu", "gpu", "data", "manual")
MARKER = re.compile(r"^<!-- doc-test: (?P<body>.*?) -->\s*$")
EXPECT = re.compile(r'expect="(?P<re>(?:[^"\\]|\\.)*)"(?:~(?P<value>[-+0-9.e]+)\+-(?P<tol>[0-9.e]+))?')
SET = re.compile(r'set="(?P<sets>[^"]*)"')
# commands that take a recipe: the toy-size --set goes on them
RECIPE_COMMAND = re.compile(
    r"launch/(train\.py|demo\.sh|cpu_ranks\.sh|multi_node\.sh)|avion-ds (train|eval)\b|avion_ds\.cli (train|eval)\b"
)


@dataclass
class Expect:
    pattern: str
    value: float | None = None
    tol: float = 0.0


@dataclass
class Block:
    """One ```bash block and its marker."""

    path: Path
    line: int  # of the opening fence
    text: str
    kind: str | None  # None: no marker
    multiprocess: bool = False
    sets: list[str] = field(default_factory=list)
    expects: list[Expect] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def parse_marker(body: str) -> tuple[str, bool, list[str], list[Expect]]:
    """kind, multiprocess, sets, expects of a marker's text; ValueError naming what is wrong."""
    kind = body.split()[0] if body.split() else ""
    if kind not in KINDS:
        raise ValueError(f"doc-test kind {kind!r}: expected one of {', '.join(KINDS)}")
    expects = [
        Expect(m["re"].replace('\\"', '"'), *(() if m["value"] is None else (float(m["value"]), float(m["tol"]))))
        for m in EXPECT.finditer(body)
    ]
    sets = [s for m in SET.finditer(body) for s in shlex.split(m["sets"])]
    rest = SET.sub("", EXPECT.sub("", body)).split()[1:]
    unknown = [w for w in rest if w != "multiprocess"]
    if unknown:
        raise ValueError(f"doc-test marker: unknown words {unknown}")
    return kind, "multiprocess" in rest, sets, expects


def blocks(path: Path) -> list[Block]:
    """The ```bash blocks of one markdown file, in order."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            m = MARKER.match(lines[i - 1]) if i else None
            block = Block(path, i + 1, "\n".join(lines[i + 1 : end]), None)
            if m:
                block.kind, block.multiprocess, block.sets, block.expects = parse_marker(m["body"])
            out.append(block)
            i = end
        i += 1
    return out


def with_sets(text: str, sets: list[str]) -> str:
    """``text`` with ``--set K=V`` for each of ``sets`` on every recipe-taking command (continuation lines
    joined; before a trailing comment)."""
    logical = re.sub(r"\s*\\\n\s*", " ", text)
    if not sets:
        return logical
    extra = " ".join(f"--set {shlex.quote(s)}" for s in sets)
    out = []
    for line in logical.splitlines():
        if RECIPE_COMMAND.search(line) and not line.lstrip().startswith("#"):
            code, sep, comment = line.partition("  #")
            code = code.rstrip()
            bg = " &" if code.endswith("&") else ""
            line = f"{code.removesuffix('&').rstrip()} {extra}{bg}" + (f"  #{comment}" if sep else "")
        out.append(line)
    return "\n".join(out)


# a deepspeed launcher command that names no rendezvous port
LAUNCHER = re.compile(r"^(\s*)deepspeed (?!.*--master_port)", re.MULTILINE)


def on_own_port(text: str) -> str:
    """``text`` (logical lines, as ``with_sets`` gives them) with ``--master_port "$MASTER_PORT"`` on every
    deepspeed launcher command that names no port: the launcher's default is one fixed port (29500), and the
    two test workers run documented blocks at the same time."""
    return LAUNCHER.sub(r'\1deepspeed --master_port "$MASTER_PORT" ', text)

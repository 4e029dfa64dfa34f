"""Imports inside functions of avion_ds/tasks and avion_ds/config say why they are there: each carries a
``# lazy: <reason>`` comment (an optional or heavy dependency); every other import is at module level."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("avion_ds/tasks", "avion_ds/config")


def unexplained_function_imports(root: Path = ROOT, scope: tuple[str, ...] = SCOPE) -> list[str]:
    """``path:line`` of every import inside a function with no ``# lazy:`` comment on its lines."""
    out = []
    for sub in scope:
        for path in sorted((root / sub).rglob("*.py")):
            lines = path.read_text().splitlines()
            for fn in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                        if "# lazy: " not in text:
                            out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_function_level_imports_are_lazy_for_a_reason() -> None:
    found = unexplained_function_imports()
    assert not found, "imports inside functions without '# lazy: <reason>' (hoist them):\n" + "\n".join(found)


def test_the_check_finds_an_unexplained_import(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "import os\n\n\ndef f():\n    import json\n    import numpy  # lazy: heavy\n    return json, numpy\n"
    )
    assert unexplained_function_imports(tmp_path, ("pkg",)) == ["pkg/m.py:5"]

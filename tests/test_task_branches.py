"""No branch on which task runs outside avion_ds/tasks (AST walk of avion_ds/): the trainer, eval and
start-up ask the task object (tests/test_structure.py holds the walk's shared helpers)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_structure import PACKAGE, ROOT, _write

# ---- tasks: no branch on which task runs outside avion_ds/tasks ------------------------------------
TASKS_DIR = "tasks"


def task_branches(
    root: Path = ROOT, package: str = PACKAGE, names: set[str] | None = None, classes: set[str] | None = None
) -> list[str]:
    """``path:line what`` for every place outside ``package/tasks`` that branches on the task: a string
    naming a task, a comparison / membership / subscript with ``.task``, ``isinstance`` against a task
    class, or a read of ``recipe.task`` other than as the argument of ``get_task(...)``."""
    if names is None or classes is None:
        from avion_ds.tasks import get_task, task_names

        names = set(task_names())
        classes = {type(get_task(n)).__name__ for n in names}
    out = []
    for path in sorted((root / package).rglob("*.py")):
        if (root / package / TASKS_DIR) in path.parents:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        allowed = {
            id(a)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "get_task"
            for a in node.args
        }
        where = f"{path.relative_to(root)}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                out.append(f"{where}:{node.lineno} string naming task {node.value!r}")
            is_task = isinstance(node, ast.Attribute) and node.attr == "task"
            if isinstance(node, ast.Compare) and any(
                isinstance(x, ast.Attribute) and x.attr == "task" for x in [node.left, *node.comparators]
            ):
                out.append(f"{where}:{node.lineno} comparison with .task")
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Attribute) and node.slice.attr == "task":
                out.append(f"{where}:{node.lineno} lookup by .task")
            if (
                is_task
                and isinstance(node.value, (ast.Name, ast.Attribute))
                and getattr(node.value, "id", getattr(node.value, "attr", "")) == "recipe"
                and id(node) not in allowed
            ):
                out.append(f"{where}:{node.lineno} recipe.task read outside get_task(...)")
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "isinstance"
                and len(node.args) == 2
                and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & classes
            ):
                out.append(f"{where}:{node.lineno} isinstance against a task class")
    return out


def test_no_task_branch_outside_the_tasks_package() -> None:
    found = task_branches()
    assert not found, "task dispatch outside avion_ds/tasks (ask the task object instead):\n" + "\n".join(found)


def test_task_branch_check_finds_each_kind(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/tasks/__init__.py": "x = recipe.task == 'pretrain'\n",
            "pkg/a.py": "if recipe.task == 'pretrain':\n    pass\n",
            "pkg/b.py": "loss = {'pretrain': 1}[cfg.task]\n",
            "pkg/c.py": "ok = isinstance(t, PretrainTask)\n",
            "pkg/d.py": "t = get_task(recipe.task)\nname = recipe.task\n",
        },
    )
    found = task_branches(tmp_path, "pkg", names={"pretrain"}, classes={"PretrainTask"})
    text = "\n".join(found)
    assert "pkg/a.py:1 string naming task" in text and "pkg/a.py:1 comparison with .task" in text
    assert "pkg/b.py:1 lookup by .task" in text and "pkg/c.py:1 isinstance against a task class" in text
    assert "pkg/d.py:2 recipe.task read outside get_task" in text and "pkg/d.py:1" not in text
    assert "pkg/tasks" not in text

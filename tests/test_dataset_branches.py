"""No branch on a dataset's name outside avion_ds/data/datasets (AST walk of avion_ds/, as
tests/test_structure.py's task-branch check): the tasks and checks ask the dataset registry's declarations
(and zero-shot its benchmark registry, ``tasks/zero_shot/benchmarks.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_structure import PACKAGE, ROOT, _write

DATASETS_DIR = ("data", "datasets")
DATASET_KEYS = ("dataset", "val_dataset")


def _names_a_dataset_key(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr in DATASET_KEYS) or (isinstance(n, ast.Name) and n.id in DATASET_KEYS)
        for n in ast.walk(node)
    )


def dataset_branches(root: Path = ROOT, package: str = PACKAGE, names: set[str] | None = None) -> list[str]:
    """``path:line what`` for every comparison (``==``, ``!=``, ``in``, ``not in``) with a string naming a
    registered dataset, outside ``package/data/datasets``: of ``data.dataset`` / ``data.val_dataset`` (an
    attribute or a variable of that name) or of anything else (a local ``name == "epic"``); ask the
    dataset's registry declarations instead."""
    if names is None:
        from avion_ds.data.datasets.build import dataset_names

        names = set(dataset_names())
    out = []
    for path in sorted((root / package).rglob("*.py")):
        if root.joinpath(package, *DATASETS_DIR) in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            strings = {
                n.value for s in sides for n in ast.walk(s) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
            if strings & names:
                found = ", ".join(sorted(strings & names))
                what = "dataset key" if any(_names_a_dataset_key(s) for s in sides) else "a value"
                out.append(f"{path.relative_to(root)}:{node.lineno} {what} compared with {found}")
    return out


def test_no_dataset_name_branch_outside_the_datasets_package() -> None:
    found = dataset_branches()
    assert not found, (
        "dataset-name branches outside avion_ds/data/datasets (declare it in the registry):\n" + "\n".join(found)
    )


def test_dataset_branch_check_finds_each_kind(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "if recipe.data.dataset == 'epic':\n    pass\n",
            "pkg/b.py": "bad = (d.val_dataset or d.dataset) not in ('ego4d', 'epic_mir')\n",
            "pkg/c.py": "def f(dataset):\n    return dataset != 'ssv2'\n",
            "pkg/d.py": "ok = spec.label_kind == 'none'\nother = d.dataset == 'not_registered'\n",
            "pkg/f.py": "name = 'egtea'\nif name == 'charades_ego':\n    pass\n",
            "pkg/data/datasets/e.py": "own = cfg.dataset == 'epic'\n",
        },
    )
    found = dataset_branches(tmp_path, "pkg", names={"epic", "ego4d", "epic_mir", "ssv2", "charades_ego"})
    assert found == [
        "pkg/a.py:1 dataset key compared with epic",
        "pkg/b.py:1 dataset key compared with ego4d, epic_mir",
        "pkg/c.py:2 dataset key compared with ssv2",
        "pkg/f.py:2 a value compared with charades_ego",
    ], found

"""Shape checks by AST walk of avion_ds/: no import cycles between modules, no long engine functions,
a ``# lazy: <reason>`` on every function-level import.

Every import counts, also those inside functions (a lazy import is still a dependency), and
``from pkg import name`` where ``name`` is a submodule counts as an import of that submodule.
A package's ``__init__`` is a module of its own (named like the package). Imports under
``if TYPE_CHECKING:`` are not runtime dependencies and are skipped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "avion_ds"
MAX_FUNCTION_LINES = 80
# subpackages whose functions must stay under MAX_FUNCTION_LINES
LENGTH_SCOPE = ("cli", "config", "data", "distributed", "embed", "engine", "memory", "models", "storage", "tasks")
# packages (or ``name.py`` modules) where a function-level import needs a ``# lazy: <reason>`` comment on its
# (first) line: kept only for optional or heavy dependencies (deepspeed, decoders, transformers, ...)
LAZY_IMPORT_RULE_PACKAGES = (
    "cli",
    "config",
    "data",
    "distributed",
    "embed",
    "engine",
    "memory",
    "models",
    "storage",
    "tasks",
)
# files of those packages exempt from the rule (paths relative to the package)
LAZY_IMPORT_RULE_SKIP: tuple[str, ...] = ()
LAZY_MARK = re.compile(r"#\s*lazy:\s*\S")
# the layers, lowest first: a module imports only from its own top-level package or a lower layer
# (module AND function level); packages of one layer (models, data) do not import each other
LAYERS: tuple[tuple[str, ...], ...] = (
    ("config",),
    ("distributed",),
    ("storage",),
    ("models", "data"),
    ("memory",),
    ("tasks",),
    ("engine",),
    ("embed",),
    ("cli",),
)


def module_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root/package`` (``__init__`` -> the package)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """Absolute name of a (possibly relative) ``from``-import's module."""
    if not level:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (their else runs)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports_of(module: str, path: Path, modules: set[str], annotations: bool = False) -> set[str]:
    """Modules of ``modules`` that ``module`` imports anywhere in its file (module or function level);
    with ``annotations``, also those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(name: str) -> None:
        # the named module (or its closest enclosing one); the ancestor packages' __init__ run
        # first on any import and are not counted, or every submodule would "import" its package
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in modules:
                found.add(prefix)
                return

    for node in ast.walk(tree) if annotations else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base)  # `from pkg import submodule` imports the submodule
    found.discard(module)
    return found


def import_graph(root: Path = ROOT, package: str = PACKAGE, annotations: bool = False) -> dict[str, set[str]]:
    files = module_files(root, package)
    names = set(files)
    return {m: imports_of(m, p, names, annotations) for m, p in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's SCCs (iterative); only components of two or more modules (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def describe_cycle(graph: dict[str, set[str]], comp: list[str]) -> str:
    """One concrete cycle inside a component, as ``a -> b -> a`` (breadth-first from its first module)."""
    members = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return " -> ".join(reversed(path)) + f" -> {start}"
                if nxt not in prev:
                    prev[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return " <-> ".join(comp)


def import_cycles(root: Path = ROOT, package: str = PACKAGE) -> list[str]:
    graph = import_graph(root, package)
    return [f"{{{', '.join(c)}}}: {describe_cycle(graph, c)}" for c in strongly_connected(graph)]


def layer_violations(
    root: Path = ROOT, package: str = PACKAGE, layers: tuple[tuple[str, ...], ...] = LAYERS
) -> list[str]:
    """``a -> b`` for every import (module or function level) from a layer to its own or a higher one,
    and ``a: not in any layer`` for a top-level package or module the layer table does not name."""
    rank = {name: i for i, group in enumerate(layers) for name in group}
    out = []
    for module, deps in sorted(import_graph(root, package).items()):
        top = module.split(".")[1] if "." in module else ""
        if top and top not in rank:
            out.append(f"{module}: not in any layer")
            continue
        for dep in sorted(deps):
            other = dep.split(".")[1] if "." in dep else ""
            if top and other and other != top and rank.get(other, len(layers)) >= rank[top]:
                out.append(f"{module} -> {dep}")
    return out


def long_functions(
    root: Path = ROOT, package: str = PACKAGE, scope: tuple[str, ...] = LENGTH_SCOPE, limit: int = MAX_FUNCTION_LINES
) -> list[str]:
    """``path:line name (N lines)`` for every function in ``scope`` longer than ``limit`` (def line to last line)."""
    out = []
    for sub in scope:
        for path in sorted((root / package / sub).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > limit:
                        out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return out


def unexplained_lazy_imports(
    root: Path = ROOT,
    package: str = PACKAGE,
    scope: tuple[str, ...] = LAZY_IMPORT_RULE_PACKAGES,
    skip: tuple[str, ...] = LAZY_IMPORT_RULE_SKIP,
) -> list[str]:
    """``path:line import`` for every import inside a function of ``scope`` (subpackages or ``name.py``
    modules of ``package``) whose line (the first line of a multi-line import) has no ``# lazy: <reason>``."""
    out: set[tuple[str, int, str]] = set()
    for sub in scope:
        base = root / package / sub
        paths = sorted(base.rglob("*.py")) if base.is_dir() else [base]
        for path in paths:
            if path.relative_to(root / package).as_posix() in skip:
                continue
            text = path.read_text()
            lines = text.splitlines()
            for func in ast.walk(ast.parse(text, filename=str(path))):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(func):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and not LAZY_MARK.search(lines[node.lineno - 1]):
                        out.add((str(path.relative_to(root)), node.lineno, lines[node.lineno - 1].strip()))
    return [f"{where}:{line} {text}" for where, line, text in sorted(out)]


def test_no_import_cycles() -> None:
    cycles = import_cycles()
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


def test_no_model_cycles_even_through_annotations() -> None:
    """A model and its weight adapter do not import each other, not even under TYPE_CHECKING."""
    graph = import_graph(annotations=True)
    cycles = [c for c in strongly_connected(graph) if any(m.startswith(f"{PACKAGE}.models") for m in c)]
    assert not cycles, "import cycles through avion_ds.models (annotations counted):\n" + "\n".join(
        describe_cycle(graph, c) for c in cycles
    )


# model families (folders under avion_ds/models) and the families each may import; the shared modules
# of avion_ds/models import no family, except the package __init__ and the listing, which sit on top
MODEL_FAMILIES: dict[str, tuple[str, ...]] = {"vit": (), "mae": ("vit",), "clip": ("vit",)}
MODELS_ON_TOP = (f"{PACKAGE}.models", f"{PACKAGE}.models.listing")


def model_family_violations(graph: dict[str, set[str]], package: str = PACKAGE) -> list[str]:
    """``a -> b`` for every import of a model family folder that ``MODEL_FAMILIES`` does not allow."""
    prefix = f"{package}.models."

    def family(module: str) -> str | None:
        rest = module.removeprefix(prefix) if module.startswith(prefix) else None
        return rest.split(".")[0] if rest and rest.split(".")[0] in MODEL_FAMILIES else None

    out = []
    for module, deps in sorted(graph.items()):
        if not module.startswith(prefix) or module in MODELS_ON_TOP:
            continue
        own = family(module)
        allowed = {own, *MODEL_FAMILIES.get(own, ())} if own else set()
        out += [f"{module} -> {d}" for d in sorted(deps) if family(d) and family(d) not in allowed]
    return out


def test_model_cycle_check_covers_every_family_folder() -> None:
    """Every family folder is in the annotation-counted graph, and families import only what they may."""
    graph = import_graph(annotations=True)
    folders = sorted(p.name for p in (ROOT / PACKAGE / "models").iterdir() if (p / "__init__.py").is_file())
    assert sorted([*MODEL_FAMILIES, "weights"]) == folders, f"model folders {folders}: name each in MODEL_FAMILIES"
    for fam in MODEL_FAMILIES:
        assert {f"{PACKAGE}.models.{fam}", f"{PACKAGE}.models.{fam}.model"} <= set(graph), fam
    bad = model_family_violations(graph)
    assert not bad, "imports between model families (or from shared model code into one):\n" + "\n".join(bad)


def test_model_family_check_finds_a_wrong_import() -> None:
    graph = {
        f"{PACKAGE}.models.vit.model": {f"{PACKAGE}.models.clip.model"},  # base family importing another
        f"{PACKAGE}.models.registry": {f"{PACKAGE}.models.vit.sizes"},  # shared code importing a family
        f"{PACKAGE}.models.clip.model": {f"{PACKAGE}.models.vit.model", f"{PACKAGE}.models.arch"},  # allowed
        f"{PACKAGE}.models.listing": {f"{PACKAGE}.models.mae.sizes"},  # on top: allowed
    }
    assert model_family_violations(graph) == [
        f"{PACKAGE}.models.registry -> {PACKAGE}.models.vit.sizes",
        f"{PACKAGE}.models.vit.model -> {PACKAGE}.models.clip.model",
    ]


def test_layers_import_only_downward() -> None:
    bad = layer_violations()
    assert not bad, "imports against the layers (config < distributed < storage < models, data < memory < tasks < "
    "engine < embed < cli):\n" + "\n".join(bad)


def test_functions_are_short() -> None:
    long = long_functions()
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_function_level_imports_have_a_reason() -> None:
    """A function-level import is kept only for an optional or heavy dependency, its reason on its line."""
    bare = unexplained_lazy_imports()
    assert not bare, (
        "function-level imports without a '# lazy: <reason>' comment (hoist them to module level, or say why "
        "they stay):\n" + "\n".join(bare)
    )


# ---- the checks themselves must fail on what they name ---------------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.mark.parametrize(
    "files, cycle",
    [
        # module-level relative import both ways
        (
            {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n", "pkg/b.py": "from .a import x\n"},
            ["pkg.a", "pkg.b"],
        ),
        # function-level (lazy) import closes the cycle
        (
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "import pkg.b\n",
                "pkg/b.py": "def f():\n    from pkg.a import y\n    return y\n",
            },
            ["pkg.a", "pkg.b"],
        ),
        # a submodule importing a sibling through the package __init__ that imports it
        (
            {
                "pkg/__init__.py": "from .other import helper\nfrom .sub.m import g\n",
                "pkg/sub/__init__.py": "",
                "pkg/sub/m.py": "from pkg import helper\n",
                "pkg/other.py": "helper = 1\n",
            },
            ["pkg", "pkg.sub.m"],
        ),
        # `from .. import sub` where sub is a subpackage, three modules long
        (
            {
                "pkg/__init__.py": "",
                "pkg/x/__init__.py": "from .a import f\n",
                "pkg/x/a.py": "from ..y import b\n",
                "pkg/y/__init__.py": "",
                "pkg/y/b.py": "from .. import x\n",
            },
            ["pkg.x", "pkg.x.a", "pkg.y.b"],
        ),
        # an `else:` of a TYPE_CHECKING block runs
        (
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "import pkg.b\n",
                "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pkg.a\n",
            },
            ["pkg.a", "pkg.b"],
        ),
    ],
)
def test_cycle_check_detects(tmp_path: Path, files: dict[str, str], cycle: list[str]) -> None:
    _write(tmp_path, files)
    found = strongly_connected(import_graph(tmp_path, "pkg"))
    assert found == [cycle], found
    assert import_cycles(tmp_path, "pkg")[0].startswith("{" + ", ".join(cycle) + "}")


def test_annotation_imports_count_when_asked(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",
        },
    )
    assert strongly_connected(import_graph(tmp_path, "pkg")) == []
    assert strongly_connected(import_graph(tmp_path, "pkg", annotations=True)) == [["pkg.a", "pkg.b"]]


def test_cycle_check_accepts_a_dag(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import f\n",
            "pkg/a.py": "from .b import g\n",
            "pkg/b.py": "import os\n\ndef g():\n    from pkg import c\n    from pkg.c import h\n",
            "pkg/c.py": "import typing\nimport pkg.d\nif typing.TYPE_CHECKING:\n    from pkg.b import g\n",
            "pkg/d.py": "",
        },
    )
    assert import_cycles(tmp_path, "pkg") == []


def test_layer_check_finds_upward_sibling_and_unknown(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low/__init__.py": "",
            "pkg/low/a.py": "def f():\n    from pkg.high import b\n",  # function level counts
            "pkg/low/c.py": "import pkg.low.a\n",  # own package: fine
            "pkg/left.py": "from pkg import right\n",  # same layer
            "pkg/right.py": "",
            "pkg/high/__init__.py": "",
            "pkg/high/b.py": "from pkg.low import c\n",  # downward: fine
            "pkg/stray.py": "",
        },
    )
    found = layer_violations(tmp_path, "pkg", (("low",), ("left", "right"), ("high",)))
    assert found == ["pkg.left -> pkg.right", "pkg.low.a -> pkg.high.b", "pkg.stray: not in any layer"], found


def test_length_check_counts_def_to_last_line(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    _write(tmp_path, {"pkg/engine/m.py": f"def ok():\n{body}\n\ndef long():\n{body}    return 1\n"})
    found = long_functions(tmp_path, "pkg", ("engine",))
    assert found == ["pkg/engine/m.py:83 long (81 lines)"], found


def test_lazy_import_check_names_bare_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/eng/__init__.py": "import json\n",  # module level: fine
            "pkg/eng/a.py": (
                "import os\n\n"
                "def f():\n"
                "    import json\n"  # bare: named
                "    from pkg import other  # lazy: heavy\n"  # commented: fine
                "    from pkg.other import (  # lazy: optional dependency\n"
                "        x,\n"
                "        y,\n"
                "    )\n"
                "    from pkg.other import (\n"  # the comment on a later line does not count
                "        z,  # lazy: too late\n"
                "    )\n\n"
                "class C:\n"
                "    def m(self):\n"
                "        def inner():\n"
                "            import torch  # lazy heavy\n"  # no colon: not the mark
                "        return inner\n"
            ),
            "pkg/eng/skipped.py": "def g():\n    import json\n",
            "pkg/cfg.py": "def h():\n    import json\n",
            "pkg/other.py": "def k():\n    import json\n",  # outside the scope
        },
    )
    found = unexplained_lazy_imports(tmp_path, "pkg", ("eng", "cfg.py"), ("eng/skipped.py",))
    assert found == [
        "pkg/cfg.py:2 import json",
        "pkg/eng/a.py:4 import json",
        "pkg/eng/a.py:10 from pkg.other import (",
        "pkg/eng/a.py:17 import torch  # lazy heavy",
    ], found

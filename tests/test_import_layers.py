"""The import graph of ``src/normlab`` follows the layers of ``docs/architecture.md``: no circle,
no import that runs back up, and the rooms that must not meet do not.

Every ``import``/``from ... import`` in every module counts, also those inside functions (a lazy
import is still a dependency). The graph is read from the source with ``ast``; nothing is
imported. The checker itself is tested on small planted packages, so that a test of the real
tree that passes means something.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "src" / "normlab"
COMPILED = ("normlab._C",)  # the C++ extension: a module with no Python source, at the bottom

# Bottom to top. A module belongs to the layer of the longest prefix that names it (the
# prefix itself or a submodule of it); it may import its own layer and the layers below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("normlab._C", "normlab._checks", "normlab._backend", "normlab._extras", "normlab._version")),
    ("ops shared", ("normlab.ops",)),  # extension, _register, _transforms, numerics, layouts, forward_mode
    ("ops families", ("normlab.ops.layer_norm", "normlab.ops.batch_norm", "normlab.ops.group_norm", "normlab.ops.dyt")),
    ("functional", ("normlab.functional",)),
    ("nn", ("normlab.nn",)),
    ("tools", ("normlab.tools",)),
    ("programs", ("normlab.demos", "normlab.bench", "normlab.docs_site")),
    ("experiments", ("normlab.experiments",)),
    ("figures", ("normlab.figures",)),
    ("cli", ("normlab.cli", "normlab.__main__")),
    ("package", ("normlab",)),  # normlab/__init__.py: the public face, imported by nothing inside
]
FAMILIES = LAYERS[2][1]
# Layers that reach the math only through normlab.functional, never normlab.ops
THROUGH_FUNCTIONAL = ("normlab.nn", "normlab.tools")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports (names as ``normlab.x.y``)."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    package = root.name
    known = set(paths) | {f"{package}.{c.split('.', 1)[1]}" for c in COMPILED}
    graph = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod != package and not mod.startswith(package + "."):
                    continue
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    deps.add(sub if sub in known else mod)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        deps.add(alias.name)
        graph[name] = {d for d in deps if d != name}
    return graph


def layer_of(module: str) -> int | None:
    best, best_len = None, -1
    for rank, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = rank, len(p)
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module in a higher layer, as ``a (layer) -> b (layer)``."""
    bad = []
    for a, deps in sorted(graph.items()):
        for b in sorted(deps):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                bad.append(f"{a} ({LAYERS[la][0]}) -> {b} ({LAYERS[lb][0]})")
    return bad


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports between rooms that must not meet: one ops family and another; nn/ or tools/ and ops/."""
    bad = []
    for a, deps in sorted(graph.items()):
        fam_a = next((f for f in FAMILIES if a == f or a.startswith(f + ".")), None)
        for b in sorted(deps):
            fam_b = next((f for f in FAMILIES if b == f or b.startswith(f + ".")), None)
            if fam_a and fam_b and fam_a != fam_b:
                bad.append(f"{a} -> {b} (one ops family reaching into another)")
            if a.startswith(THROUGH_FUNCTIONAL) and (b == "normlab.ops" or b.startswith("normlab.ops.")):
                bad.append(f"{a} -> {b} (above functional, the math is reached through normlab.functional)")
    return bad


# ---------------------------------------------------------------------------------------------
# The real tree
# ---------------------------------------------------------------------------------------------

GRAPH = import_graph(ROOT)


def test_the_graph_is_read():
    assert len(GRAPH) > 50
    assert "normlab.functional.row_norms" in GRAPH["normlab.functional"]
    assert "normlab._C" in GRAPH["normlab.ops.extension"]


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer_of(m) is None] == []


def test_no_import_circle():
    assert cycles(GRAPH) == []


def test_no_import_runs_back_up():
    assert upward(GRAPH) == []


def test_nothing_inside_imports_the_package_itself():
    assert [m for m, deps in GRAPH.items() if "normlab" in deps] == []


def test_rooms_that_must_not_meet_do_not():
    assert crossings(GRAPH) == []


# ---------------------------------------------------------------------------------------------
# The checker, on planted packages
# ---------------------------------------------------------------------------------------------


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "normlab"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


CLEAN = {
    "__init__.py": "from . import nn\n",
    "_backend.py": "",
    "ops/__init__.py": "",
    "ops/layouts.py": "",
    "ops/layer_norm/__init__.py": "from ..layouts import rows\nfrom ... import _backend\n",
    "functional/__init__.py": "from ..ops import layer_norm\n",
    "nn/__init__.py": "from .. import functional as F\n",
}


def test_a_clean_planted_tree_passes(tmp_path):
    g = import_graph(_plant(tmp_path, CLEAN))
    assert g["normlab.ops.layer_norm"] == {"normlab.ops.layouts", "normlab._backend"}
    assert cycles(g) == [] and upward(g) == [] and crossings(g) == []


@pytest.mark.parametrize("module, line, finding", [
    ("ops/layouts.py", "def f():\n    from .. import functional\n", "upward"),  # lazy, still counted
    ("ops/layer_norm/reference.py", "from ... import nn\n", "upward"),
    ("functional/x.py", "import normlab\n", "upward"),  # the package __init__ from inside
    ("_backend.py", "from .ops.layouts import rows\n", "upward"),
    ("ops/layer_norm/x.py", "from ..batch_norm import reference\n", "crossing"),
    ("nn/x.py", "from ..ops.layouts import rows\n", "crossing"),
    ("functional/x.py", "from . import y\n", "cycle"),
])
def test_the_checker_finds_a_planted_fault(tmp_path, module, line, finding):
    files = dict(CLEAN, **{"ops/batch_norm/__init__.py": "", "ops/batch_norm/reference.py": ""})
    files[module] = line
    if finding == "cycle":
        files["functional/y.py"] = "from .x import z\n"
    g = import_graph(_plant(tmp_path, files))
    found = {"cycle": bool(cycles(g)), "upward": bool(upward(g)), "crossing": bool(crossings(g))}
    assert found[finding], (module, line, g)

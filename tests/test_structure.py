"""The package's import graph: no circle, and imports inside functions only where they keep an
import light (each such place says why, measured, in a comment).

The graph is read from the source (every ``import``, at any depth, ``TYPE_CHECKING`` ones
too), one node per module; a circle is a strongly connected component of more than one
module, or a module importing itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbresponses

PACKAGE = Path(nbresponses.__file__).parent
ROOT = PACKAGE.parent

# files whose function-level imports of the package's own modules are kept, and why: each
# defers a measured import cost that most users of the file never need
DEFERRED_IMPORTS = {
    "nbresponses/__init__.py": "the lazy public names: `import nbresponses` stays light",
    "nbresponses/analysis/analyses.py": "pandas (~2.5 s under load) only when a frame is built",
    "nbresponses/cli.py": "each command imports what it runs: `nbresponses --help` stays fast",
    "nbresponses/engine.py": "the in-process server (httpx, the SDK's client): engine.openai()",
    "nbresponses/families/registry.py": "one family per model (~0.25 s each)",
    "nbresponses/runtime/generator.py": "preparing a model (export, quantize) only on load",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, ast.AST]]:
    """(imported module of ours, the import node) for every import in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, ast.AST]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if not base.startswith("nbresponses"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in known else base
                if target in known:
                    found.append((target, node))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: {t for t, _ in _imports(name, path, known) if t != name}
        for name, path in modules.items()
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_circle() -> None:
    graph = _graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the graph was read
    assert _circles(graph) == []


def test_imports_inside_functions_only_where_they_keep_an_import_light() -> None:
    modules = _modules()
    known = set(modules)
    deferred: dict[str, list[int]] = {}
    for name, path in modules.items():
        top = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                top |= {id(n) for n in ast.walk(fn)}
        for _, node in _imports(name, path, known):
            if id(node) in top:
                rel = path.relative_to(ROOT).as_posix()
                deferred.setdefault(rel, []).append(node.lineno)  # type: ignore[attr-defined]
    unexplained = {f: lines for f, lines in deferred.items() if f not in DEFERRED_IMPORTS}
    assert unexplained == {}, "import these at the top, or measure and explain the saving"
    assert sum(len(set(v)) for v in deferred.values()) <= 18

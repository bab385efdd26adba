"""The import graph of the tkg package (tkg/ and backends/, installed as tkg.backends), read from the source with
``ast``: no module imports one that imports it back, except through the few lazy imports listed below with their
reasons; the doors depend on the library and never the other way round; and, run for real, importing the command
line loads no server and importing a server's bootstrap loads no command line.

Edges are what a module's own import statements name. Imports under ``if TYPE_CHECKING:`` never run and are left
out. The import of a parent package that Python does first (``tkg`` before ``tkg.memory``) is left out too: a
package whose ``__init__`` re-exports its submodules is the usual shape, and Python initialises the parent first.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Lazy imports (inside a function) that close a cycle, and why each is there. A new one must be added here with
#: its reason, or, better, the cycle broken.
LAZY_CYCLES: Mapping[tuple[str, str], str] = {
    ("tkg.cli", "tkg"): "__version__ lives in the package __init__, which imports the whole library",
    ("tkg.http_service", "tkg"): "__version__ for the OpenAPI document",
    ("tkg.mcp_server", "tkg"): "__version__ for the MCP server's handshake",
    ("tkg.memory", "tkg.backends.memory"): "a Memory without a store gets the in-memory backend (it imports the core)",
    ("tkg.persistence", "tkg.backends.memory"): "loading a snapshot without a store builds the in-memory backend",
}

#: The agent-facing doors: the command line and the servers, with what they are built from.
DOORS = frozenset(
    {
        "tkg.cli",
        "tkg.cli_ingest",
        "tkg.cli_input",
        "tkg.cli_output",
        "tkg.compat",
        "tkg.compat.mem0",
        "tkg.compat.mem0_filters",
        "tkg.demo",
        "tkg.environment",
        "tkg.locations",
        "tkg.serving",
        "tkg.wire_requests",
        "tkg.wire_shapes",
        "tkg.tenancy",
        "tkg.http_gate",
        "tkg.http_service",
        "tkg.mcp_server",
    }
)
#: The command line (its parser and commands), and what only the servers use. The servers share the command line's
#: other pieces: the demo (its data is JSONL in the ``tkg ingest`` format), the embedder and LLM from the
#: environment, opening a snapshot path.
CLI = frozenset({"tkg.cli"})
SERVERS = frozenset({"tkg.serving", "tkg.tenancy", "tkg.http_gate", "tkg.http_service", "tkg.mcp_server"})


@dataclass
class Graph:
    """Module name -> the tkg modules it imports: ``eager`` at import time, ``lazy`` inside functions."""

    modules: dict[str, Path]
    eager: dict[str, set[str]] = field(default_factory=dict)
    lazy: dict[str, set[str]] = field(default_factory=dict)

    def edges(self, *, lazy: bool) -> dict[str, set[str]]:
        return {m: self.eager[m] | (self.lazy[m] if lazy else set()) for m in self.modules}


def source_roots() -> dict[str, Path]:
    """Package name -> its folder, as pyproject.toml installs them (backends/ becomes tkg.backends)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def find_modules(roots: Mapping[str, Path]) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: Iterable[ast.stmt], in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``body`` with whether it runs inside a function (skipping TYPE_CHECKING)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse, in_function)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _imports(node.body, True)
        else:  # a class body, try/except, with, for, if, match: run at import when the module runs them
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports([child], in_function)
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from _imports(child.body, in_function)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: Mapping[str, Path]) -> set[str]:
    """The known modules an import statement loads (a name imported from a package may be a submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            anchor = package[: len(package) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for name in names:
        while name and name not in known:  # `import tkg.llm.openai as x` loads tkg.llm.openai, a known module
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def build_graph() -> Graph:
    modules = find_modules(source_roots())
    graph = Graph(modules)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph.eager[name], graph.lazy[name] = set(), set()
        for node, in_function in _imports(tree.body, False):
            targets = _targets(node, name, path.name == "__init__.py", modules) - {name}
            (graph.lazy if in_function else graph.eager)[name] |= targets
    return graph


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def reachable(edges: Mapping[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in edges.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph()


# -- the reader itself ---------------------------------------------------------------------------------------------


def test_the_reader_sees_what_python_runs(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "sub").mkdir()
    known = {"pkg": tmp_path, "pkg.a": tmp_path, "pkg.b": tmp_path, "pkg.sub": tmp_path, "pkg.sub.c": tmp_path}
    source = """
from typing import TYPE_CHECKING
import json
from pkg import a
from . import sub
try:
    from pkg.sub.c import thing
except ImportError:
    pass
if TYPE_CHECKING:
    from pkg import b
def later():
    from .sub import c
    import pkg.b
class K:
    from pkg import __version__
"""
    tree = ast.parse(source)
    eager = set().union(*(_targets(n, "pkg.x", False, known) for n, lazy in _imports(tree.body, False) if not lazy))
    lazy = set().union(*(_targets(n, "pkg.x", False, known) for n, lazy in _imports(tree.body, False) if lazy))
    assert eager == {"pkg", "pkg.a", "pkg.sub", "pkg.sub.c"}
    assert lazy == {"pkg.sub.c", "pkg.b"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_covers_the_package(graph: Graph) -> None:
    assert graph.modules.keys() >= DOORS | {"tkg", "tkg.memory", "tkg.pictures", "tkg.backends.memory.store"}
    assert "tkg.wire" not in graph.modules  # split into wire_requests, wire_shapes and tenancy
    assert graph.eager["tkg.backends.memory"] == {"tkg.backends.memory.store"}  # a relative import, resolved


# -- no cycles -----------------------------------------------------------------------------------------------------


def test_no_module_imports_one_that_imports_it_back(graph: Graph) -> None:
    assert cycles(graph.edges(lazy=False)) == []


def test_lazy_imports_close_no_cycle_but_the_listed_ones(graph: Graph) -> None:
    edges = graph.edges(lazy=True)
    for importer, imported in LAZY_CYCLES:
        assert imported in graph.lazy[importer], f"{importer} no longer imports {imported} lazily: unlist it"
        edges[importer] = edges[importer] - {imported}
    assert cycles(edges) == []


def test_the_cli_and_the_servers_import_nothing_of_each_other(graph: Graph) -> None:
    edges = graph.edges(lazy=True)
    for module in CLI:
        assert not reachable(edges, module) & SERVERS, module
    for module in SERVERS:
        assert not reachable(edges, module) & CLI, module


def test_the_library_does_not_depend_on_its_doors(graph: Graph) -> None:
    edges = graph.edges(lazy=False)
    assert not reachable(edges, "tkg") & DOORS  # `import tkg` loads no command line and no server
    for module in graph.modules.keys() - DOORS:
        assert not graph.eager[module] & DOORS, module


# -- what importing really loads -------------------------------------------------------------------------------------


def loaded_by(module: str) -> set[str]:
    """The tkg modules a fresh interpreter has loaded after ``import module``."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('tkg.'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout))


def test_importing_a_door_loads_only_its_side() -> None:
    loaded = {name: loaded_by(name) for name in ("tkg", "tkg.cli", "tkg.serving", "tkg.wire_shapes")}
    assert not loaded["tkg"] & DOORS
    assert "tkg.cli_input" in loaded["tkg.cli"] and not loaded["tkg.cli"] & SERVERS
    assert "tkg.demo" in loaded["tkg.serving"] and not loaded["tkg.serving"] & CLI
    assert not loaded["tkg.wire_shapes"] & (CLI | SERVERS)


def test_importing_the_library_and_its_memory_backend_loads_no_igraph() -> None:
    """igraph, with matplotlib which it imports when installed, is half of the objects of a fresh process (each
    full garbage collection walks them) and half of tkg's import time; only community detection and the GraphML
    export need it, and import it when first run."""
    code = (
        "import sys, tkg, tkg.backends.memory; from tkg import Memory, HashEmbedder, MemoryConfig; "
        "m = Memory(embedder=HashEmbedder(), config=MemoryConfig(communities=None)); "
        "m.add_facts([tkg.FactInput('Ann', 'LIKES', 'Tea')], group_id='g'); m.search('Ann', group_ids=['g']); "
        "print(sorted(n for n in ('igraph', 'matplotlib') if n in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"

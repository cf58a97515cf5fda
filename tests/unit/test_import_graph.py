"""The project's import graph, read from the source with `ast`: layers point one way and nothing imports in a circle.

Every import that runs counts, at module level or inside a function: an import inside a function still closes a
cycle when it runs, it only hides it from the reader. Only an `if TYPE_CHECKING:` import is left out: it never runs
(a type checker reads it). Within the backend that one counts too: its layers go one way (start-up's settings, then
the parsing of vLLM's arguments they hold, then the engine's config overrides that parsing applies), and a type
imported back up the layers ties two modules that are meant to be read, and changed, one after the other. Edges go
to the module named (`from a import b` to `a.b` where b is a module, else to `a`); the parent packages Python runs
on the way are not edges, so a package's `__init__` that imports its own submodules is no cycle.

What the frontend may import (no torch, vLLM, numpy, backend) is tests/unit/test_frontend_imports.py's; here, only
what those rules cannot see from one file: a frontend module reaching torch or vLLM through another project module.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("frontend", "backend", "protocol", "common", "poc", "sampling", "pocserve", "bench")
# poc/ is the PoC math: the engine imports it, never the other way (its worker side is backend/engine/pocworker/).
POC_MUST_NOT_IMPORT = ("backend", "frontend", "pocserve", "bench", "vllm")
HEAVY = ("torch", "vllm")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    is_package = _modules()[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_nodes(tree: ast.AST, type_only_too: bool = False) -> list[ast.AST]:
    """ast.walk, less the bodies of `if TYPE_CHECKING:` (their `else` runs), unless `type_only_too`."""
    if type_only_too:
        return list(ast.walk(tree))
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if _is_type_checking(node):
            assert isinstance(node, ast.If)
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return nodes


@cache
def imports(module: str, type_only_too: bool = False) -> frozenset[str]:
    """Every module `module` imports when it runs (project modules and outside ones, by full name), at any depth of
    its code; with `type_only_too`, its `if TYPE_CHECKING:` imports as well."""
    names: set[str] = set()
    tree = ast.parse(_modules()[module].read_text(), filename=str(_modules()[module]))
    for node in _run_time_nodes(tree, type_only_too):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                names.add(sub if sub in _modules() else target)
    return frozenset(names)


def cycles(type_only_too: bool = False, within: str = "") -> list[list[str]]:
    """The graph's strongly connected components of more than one module (or a module importing itself), each
    sorted: Tarjan's algorithm, iterative. `within`: only the modules of that package and the edges among them."""

    def _project_edges(module: str) -> list[str]:
        return sorted(name for name in imports(module, type_only_too) if name in _modules() and _inside(name))

    def _inside(module: str) -> bool:
        return not within or module == within or module.startswith(within + ".")

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in filter(_inside, _modules()):
        if root in index:
            continue
        work = [(root, iter(_project_edges(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(_project_edges(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in _project_edges(node):
                    found.append(sorted(component))
    return sorted(found)


def _root(name: str) -> str:
    return name.split(".")[0]


def test_the_graph_sees_every_package():
    assert {_root(m) for m in _modules()} == set(PACKAGES)
    # A known edge at each depth: module level, and inside a function (compat imports vLLM only when called).
    assert "backend.engine.compat" in imports("backend.engine.adapter")
    assert "vllm.v1.worker" in imports("backend.engine.compat")


def test_no_import_cycle():
    assert cycles() == []


def test_no_cycle_in_the_backend_even_through_type_only_imports():
    assert cycles(type_only_too=True, within="backend") == []


def test_settings_then_vllm_arguments_then_the_engines_overrides():
    """The one circle this test was extended for (engine/args.py named the settings' class for a type): the order
    it now keeps, each edge present, none back."""
    assert "backend.startup.vllm_args" in imports("backend.startup.settings")
    assert "backend.engine.args" in imports("backend.startup.vllm_args")
    assert not {n for n in imports("backend.engine.args", type_only_too=True) if _root(n) == "backend"}


@pytest.mark.parametrize("b_source,type_only_too,expected", [
    ("def f():\n    from p.a import x\n", False, [["a", "b"]]),  # hidden in a function: still a cycle
    ("from . import a\n", False, [["a", "b"]]),  # relative
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.a\n", False, []),  # never runs
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.a\n", True, [["a", "b"]]),  # counted
    ("import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import p.a\n", False, [["a", "b"]]),
])
def test_cycle_finder(tmp_path, monkeypatch, b_source, type_only_too, expected):
    """The finder itself, on two modules of a package p where a imports b at module level."""
    (tmp_path / "a.py").write_text("import p.b\n")
    (tmp_path / "b.py").write_text(b_source)
    monkeypatch.setattr(f"{__name__}._modules", lambda: {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"})
    imports.cache_clear()
    try:
        assert cycles(type_only_too) == [[f"p.{m}" for m in c] for c in expected]
        assert cycles(type_only_too, within="q") == []  # neither module is q's
    finally:
        imports.cache_clear()


def test_poc_imports_no_engine_and_nothing_above_it():
    offenders = {m: sorted(n for n in imports(m) if _root(n) in POC_MUST_NOT_IMPORT)
                 for m in _modules() if _root(m) == "poc"}
    assert {m: names for m, names in offenders.items() if names} == {}


def test_frontend_reaches_no_torch_or_vllm_through_other_modules():
    """The transitive closure over project modules of every frontend module's imports."""
    reached: dict[str, str] = {}  # heavy module -> the project module importing it
    seen: set[str] = set()
    todo = [m for m in _modules() if _root(m) == "frontend"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in imports(module):
            if _root(name) in HEAVY:
                reached.setdefault(name, module)
            elif name in _modules():
                todo.append(name)
    assert reached == {}

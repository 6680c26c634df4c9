"""The house's arrows, read from the source: which package may import which, and no cycles.

``import_graph(root)`` parses every module of the product's packages and the
simulator under ``root`` and returns, per module, the modules it imports and
where. Every import counts: at module level, inside a function, under ``if
TYPE_CHECKING:``, relative or absolute. ``violations(graph)`` names each
import that breaks a rule below and each cycle of modules importing each
other, directly or around a longer loop. ``bench/`` and ``tests/`` are outside
the rules.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The packages the rules cover: the product's, the simulator, and the wiring.
PACKAGES = (
    "zoekt",
    "planner",
    "eviction",
    "api",
    "gitlab_sync",
    "dashboard",
    "simulator",
    "config",
)

#: The product's packages (everything but the simulator and the wiring).
PRODUCT = frozenset({"zoekt", "planner", "eviction", "api", "gitlab_sync", "dashboard"})

#: What each package may import besides itself (``../shared/DESIGN.md``'s arrows):
#: api → zoekt ← planner ← eviction; the dashboard reads the product; the simulator
#: may use anything but the wiring; nothing in the product imports the simulator,
#: nothing imports the wiring, and nothing in zoekt imports upwards.
ALLOWED: Mapping[str, frozenset[str]] = {
    "zoekt": frozenset(),
    "planner": frozenset({"zoekt"}),
    # Its operator endpoint (moving one index by hand) builds on the API's base view,
    # strict serializer and error shape; the API imports nothing of it.
    "eviction": frozenset({"zoekt", "planner", "api"}),
    "api": frozenset({"zoekt"}),
    # Following GitLab: it writes the catalog through zoekt.catalog, the bulk API's path too.
    "gitlab_sync": frozenset({"zoekt"}),
    "dashboard": frozenset({"zoekt", "planner", "eviction", "api", "gitlab_sync"}),
    "simulator": PRODUCT,
    # The wiring (settings, the Celery app and its beat, the URL root, the WSGI entry, the
    # embedded servers' launcher) connects the apps: it may import every product package.
    "config": PRODUCT,
}


@dataclasses.dataclass(frozen=True, order=True)
class Import:
    target: str
    line: int


Graph = dict[str, set[Import]]


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            modules[_module_name(root, path)] = path
    return modules


def _owner(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``name`` lives in: itself, or the nearest enclosing module we know."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: Mapping[str, Path]
) -> Iterable[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if (target := _owner(alias.name, modules)) is not None:
                yield target
        return
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    for alias in node.names:
        # ``from zoekt import models`` imports the module zoekt.models;
        # ``from zoekt.models import Node`` imports zoekt.models.
        submodule = f"{source}.{alias.name}"
        target = submodule if submodule in modules else _owner(source, modules)
        if target is not None:
            yield target


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """Every first-party import of every module under ``root``'s packages."""
    modules = _modules(root, packages)
    graph: Graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[Import] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(node, module, path.name == "__init__.py", modules):
                    if target != module:
                        edges.add(Import(target, node.lineno))
        graph[module] = edges
    return graph


def _package(module: str) -> str:
    return module.partition(".")[0]


def forbidden_arrow(importer: str, imported: str) -> bool:
    source, target = _package(importer), _package(imported)
    if source == target:
        return False
    return target not in ALLOWED.get(source, frozenset())


def cycles(graph: Mapping[str, Iterable[Import]]) -> list[list[str]]:
    """Each set of modules that import one another (strongly connected, more than one)."""
    successors = {
        module: sorted({edge.target for edge in edges}) for module, edges in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Tarjan's algorithm, iterative: the import graph is deep enough for recursion limits.
        work = [(start, iter(successors.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors.get(child, ()))))
                    break
                if child in on_stack:
                    low[module] = min(low[module], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(successors):
        if module not in index:
            visit(module)
    return sorted(found)


def violations(graph: Mapping[str, Iterable[Import]]) -> list[str]:
    """One line per forbidden import and per cycle; empty when the house is in order."""
    lines = [
        f"{importer} (line {edge.line}) imports {edge.target}: "
        f"{_package(importer)} may not import {_package(edge.target)}"
        for importer in sorted(graph)
        for edge in sorted(graph[importer])
        if forbidden_arrow(importer, edge.target)
    ]
    lines += [f"import cycle: {' ↔ '.join(component)}" for component in cycles(graph)]
    return lines

"""The import rules of the three packages, checked from their source and in fresh interpreters.

- No import cycle among the modules of ``cosmos3_runtime``, ``policy_server`` and ``robot_clients``:
  every import counts, those under ``if TYPE_CHECKING:`` and those inside functions included, since a
  cycle hidden there is still two modules that cannot be understood (or moved) one without the other.
- Folders import one way: no two folders import each other (:func:`mutual_imports`). A folder here is a
  subpackage (``policy_server.assembly``, ``policy_server.sessions``, ``policy_server.foundation``...) or a
  package's own other modules, its floor (``policy_server``'s ``context.py``, ``session_config.py``...).
  Between any two the imports run one way, so each folder reads as one floor, with no list of exceptions.
- ``robot_clients`` imports neither ``policy_server`` nor ``cosmos3_runtime``: it is what a robot installs,
  and the dependency runs the other way (the server uses the client's codec and protocol).
- Only the command line imports ``PolicyServer``: sessions, the sidecar and the backends see the server
  through the one ``ServerContext`` (``policy_server.context``) the server hands them.
- What importing a module costs: a robot installs ``robot_clients`` for the codec and the protocol, and a
  chunker running a local policy must not pull websockets in. Those checks run in a fresh interpreter,
  since this one has loaded everything already.

The graph is read with :mod:`ast`, never by importing, so it is fast and sees every branch.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cosmos3_runtime", "policy_server", "robot_clients")
# The one module allowed to import PolicyServer: it builds the server from the command line.
POLICY_SERVER_IMPORTERS = {"policy_server.assembly.cli"}


def project_modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its own name, for its __init__)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module ``from ... import`` names, relative levels resolved against ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]  # a module's imports are relative to its package
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _within(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` denotes: itself, or the longest prefix that is one (``pkg.mod.attr``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """For each project module, the project modules it imports anywhere in its source."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [_within(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _imported_from(node, module, path.name == "__init__.py")
                # `from pkg import name` imports the submodule pkg.name when there is one, else pkg itself.
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else _within(source, modules)
                    for alias in node.names
                ]
            else:
                continue
            edges.update(target for target in targets if target is not None and target != module)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The shortest cycle (``a -> b -> ... -> a``) through each module that is on one, each cycle once.

    Modules on cycles are found as strongly connected groups (Tarjan's algorithm); listing a cycle per
    module, not per group, names every import that has to go.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles: dict[tuple[str, ...], list[str]] = {}
    for group in groups:
        for start in sorted(group):
            cycle = _cycle_through(start, group, graph)
            first = cycle.index(min(cycle))  # one rotation per cycle, so each is listed once
            rotated = cycle[first:-1] + cycle[:first] + [cycle[first]]
            cycles.setdefault(tuple(rotated), rotated)
    return sorted(cycles.values())


def _cycle_through(start: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest path from ``start`` back to itself, inside its strongly connected group."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    next_frontier.append(target)
        frontier = next_frontier
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")  # a strongly connected group has one


def package_of(module: str, subpackages: set[str]) -> str:
    """The folder ``module`` counts in for the one-way rule: its subpackage (the first two names, when they
    are one), or its package's floor (the package's own other modules)."""
    subpackage = ".".join(module.split(".")[:2])
    return subpackage if subpackage in subpackages else module.split(".")[0] + " (floor)"


def mutual_imports(graph: dict[str, set[str]], package: Callable[[str], str]) -> list[str]:
    """Each pair of packages (``package(module)``) that import each other, once, with the imports both ways."""
    between: dict[tuple[str, str], list[str]] = {}
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            pair = (package(module), package(target))
            if pair[0] != pair[1]:
                between.setdefault(pair, []).append(f"{module} -> {target}")
    return [
        f"{a} <-> {b}: {', '.join(between[a, b])}; {', '.join(between[b, a])}"
        for a, b in sorted(between)
        if a < b and (b, a) in between
    ]


def test_the_graph_sees_every_kind_of_import():
    """The reader itself: relative levels, submodules named in `from`, TYPE_CHECKING and function-local."""
    graph = import_graph()
    assert "robot_clients.protocol" in graph["robot_clients.client"]  # `from . import protocol`
    assert "robot_clients.client" in graph["robot_clients.chunker"]  # under TYPE_CHECKING
    assert "policy_server.engine.thread_policy" in graph["policy_server"]  # a package's __init__
    assert "cosmos3_runtime.random_checkpoints" in graph["cosmos3_runtime.cli"]  # an import inside a function


def test_no_import_cycle_among_the_projects_modules():
    cycles = import_cycles(import_graph())
    for cycle in cycles:
        print("import cycle: " + " -> ".join(cycle))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_packages_import_each_other():
    modules = project_modules()
    subpackages = {name for name, path in modules.items() if path.name == "__init__.py" and name.count(".") == 1}
    pairs = mutual_imports(import_graph(), lambda module: package_of(module, subpackages))
    for pair in pairs:
        print("packages that import each other: " + pair)
    assert not pairs, "packages that import each other:\n" + "\n".join(pairs)


def test_two_packages_that_import_each_other_are_named():
    graph = {"p.a.x": {"p.b.y", "p.a.w"}, "p.b.y": set(), "p.b.z": {"p.a.w"}, "p.a.w": set(), "p.c": {"p.a.x"}}
    assert mutual_imports(graph, lambda module: package_of(module, {"p.a", "p.b"})) == [
        "p.a <-> p.b: p.a.x -> p.b.y; p.b.z -> p.a.w"
    ]
    assert mutual_imports({"p.a.x": {"p.b.y"}, "p.b.y": set()}, lambda module: package_of(module, {"p.a", "p.b"})) == []
    assert package_of("policy_server.assembly.server", {"policy_server.assembly"}) == "policy_server.assembly"
    assert package_of("policy_server.context", {"policy_server.sessions"}) == "policy_server (floor)"


def test_robot_clients_imports_neither_the_server_nor_the_runtime():
    graph = import_graph()
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.split(".")[0] == "robot_clients"
        for target in targets
        if target.split(".")[0] in ("policy_server", "cosmos3_runtime")
    )
    assert not upward, "robot_clients imports the server or the runtime:\n" + "\n".join(upward)


def test_only_the_cli_imports_the_policy_server():
    importers = set()
    for module, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and any(alias.name == "PolicyServer" for alias in node.names):
                importers.add(module)
    outside = sorted(importers - POLICY_SERVER_IMPORTERS)
    assert not outside, f"PolicyServer imported by {outside}"


def third_party_modules(module: str) -> set[str]:
    """Top-level modules outside the standard library (and outside ``robot_clients``) that importing
    ``module`` loads, measured in a fresh interpreter."""
    script = (
        f"import json, sys; import {module}; print(json.dumps(sorted({{name.split('.')[0] for name in sys.modules}})))"
    )
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    )
    return {
        name
        for name in loaded
        if name not in sys.stdlib_module_names
        and not name.startswith("_")
        and name not in ("robot_clients", "cython_runtime")
    }


@pytest.mark.parametrize(
    "module",
    [
        "robot_clients.wire_codec",
        "robot_clients.protocol",
        "robot_clients.client_frames",
    ],
)
def test_the_codec_and_the_protocol_import_nothing_but_numpy_and_msgpack(module):
    assert third_party_modules(module) <= {"numpy", "msgpack"}


def test_the_protocol_names_import_not_even_numpy():
    assert third_party_modules("robot_clients.protocol") == set()


def test_the_chunker_imports_no_websockets():
    assert third_party_modules("robot_clients.chunker") <= {"numpy"}


def test_no_class_name_is_defined_twice():
    """Each concept is declared once: two product classes of one name are two shapes of one thing."""
    homes: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    homes.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in homes.items() if len(paths) > 1} == {}

"""Import rules of STYLE.md, by folder: a folder is a layer, and each imports only the layers
under it; no import cycle anywhere; a pure core; Starlette and uvicorn only at the edges.

A new module is checked the day it is written: its layer is its folder. ``make check`` runs
the same layers as an import-linter contract (``pyproject.toml``); this test also sees what
import-linter does not: imports inside functions and under ``TYPE_CHECKING``, cycles, and
what importing the core really loads.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MODULES = sorted([*ROOT.glob("gateway/**/*.py"), *ROOT.glob("client_sdk/**/*.py")])
GATEWAY = sorted(ROOT.glob("gateway/**/*.py"))

LAYERS: list[set[str]] = [
    {"errors"},
    {"config", "logging"},
    {"core"},
    {"wire"},
    {"providers", "store", "tools", "auth", "voice"},
    {"agent", "demo"},
    {"shell"},
    {"edge"},
    {"__main__"},
]
"""Lowest first. A module's layer is its folder under ``gateway/`` (or its own name for the
modules at the top). It may import its own layer and the ones before it; the folders that
share a layer (siblings) never import one another."""

FACADES = {"__init__", "protocol", "server_tool", "confirm"}
"""``gateway/__init__.py`` (the tool author's lazy names) and the old documented paths, kept
as plain re-exports: the top of the house, which no module of the gateway imports."""

PURE_LAYERS = {"core", "wire"}
PURE_ELSEWHERE = {
    "gateway/errors.py",
    "gateway/auth/admission.py",
    "gateway/providers/base.py",
    "gateway/shell/outqueue.py",
    "gateway/voice/base.py",
    "gateway/voice/turns.py",
}
"""Policy that sits with its users rather than in the core, and is as pure as the core."""
NO_THIRD_PARTY = {"gateway/config.py"}
"""Reads the environment and files (the CLI's), but needs nothing beyond msgspec."""
# referencing is jsonschema's own resolver; re2 runs client regexes in linear time.
PURE_THIRD_PARTY = {"msgspec", "jsonschema", "referencing", "re2"}
IO_MODULES = {"asyncio", "socket", "time", "os", "random", "secrets", "threading", "select"}
SHELL_PACKAGES = {
    *("httpx", "asyncio", "structlog", "starlette", "uvicorn", "prometheus_client", "redis"),
}
"""What importing the core must not load, even through another module's imports."""
THIRD_PARTY_HOMES = {"starlette": {"edge"}, "uvicorn": {"edge", "__main__"}, "redis": {"store"}}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def folder(name: str) -> str:
    """``gateway.core.session`` -> ``core``; ``gateway.errors`` -> ``errors``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(name: str) -> int | None:
    place = folder(name)
    return next((i for i, names in enumerate(LAYERS) if place in names), None)


KNOWN = {module_name(path) for path in MODULES}


def imported(path: Path) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports, wherever the import stands (top level, a function,
    ``TYPE_CHECKING``), with its line; ``from package import module`` names the module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield (submodule if submodule in KNOWN else node.module), node.lineno


def gateway_imports(path: Path) -> set[str]:
    return {name for name, _ in imported(path) if name.split(".")[0] == "gateway"}


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", GATEWAY, ids=rel)
def test_module_imports_only_the_layers_under_it(path: Path):
    name = module_name(path)
    if folder(name) in FACADES:
        return
    own = layer_of(name)
    assert own is not None, f"{rel(path)}: {folder(name)!r} is in no layer of LAYERS"
    for target in sorted(gateway_imports(path)):
        assert folder(target) not in FACADES - {"__init__"}, (
            f"{rel(path)} imports the re-export {target}: import where the name lives"
        )
        if target == "gateway":  # __version__; the lazy names are for tool authors
            continue
        theirs = layer_of(target)
        assert theirs is not None, f"{rel(path)} imports {target}, in no layer"
        assert theirs <= own, f"{rel(path)} imports {target}, above it"
        if theirs == own and folder(target) != folder(name):
            raise AssertionError(f"{rel(path)} imports its sibling {target}")


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_module_respects_the_purity_rules(path: Path):
    name, tops = rel(path), {top(module) for module, _ in imported(path)}
    place = folder(module_name(path)) if name.startswith("gateway/") else None
    if place in PURE_LAYERS or name in PURE_ELSEWHERE | NO_THIRD_PARTY:
        third_party = tops - set(sys.stdlib_module_names) - {"gateway", "__future__"}
        assert third_party <= PURE_THIRD_PARTY, f"{name} imports {third_party}"
    if place in PURE_LAYERS or name in PURE_ELSEWHERE:
        assert not tops & IO_MODULES, f"{name} does I/O or reads a clock: {tops & IO_MODULES}"
    if place in PURE_LAYERS:
        from_gateway = {folder(m) for m in gateway_imports(path)}
        assert from_gateway <= PURE_LAYERS | {"errors"}, f"{name} imports {from_gateway}"
    for library, homes in THIRD_PARTY_HOMES.items():
        if library in tops:
            assert place in homes, f"{library} may appear only in {sorted(homes)}, not {name}"
    if name.startswith("client_sdk/"):
        from_gateway = gateway_imports(path)
        assert all(m.startswith("gateway.wire.") or m == "gateway.errors" for m in from_gateway), (
            f"{name} imports {from_gateway}: only the wire vocabulary and errors"
        )


def import_graph() -> dict[str, set[str]]:
    graph = {module_name(path): set[str]() for path in GATEWAY}
    for path in GATEWAY:
        graph[module_name(path)] = {m for m in gateway_imports(path) if m in graph}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), or of one that
    imports itself: each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_anywhere_in_the_gateway():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_module_declares_all(path: Path):
    tree = ast.parse(path.read_text())
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.ImportFrom)
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [ast.Name(alias.asname) for alias in node.names if alias.asname]
            if isinstance(node, ast.ImportFrom)
            else [node.target]
        )
        if isinstance(target, ast.Name)
    }
    assert "__all__" in assigned, f"{rel(path)} has no __all__"


def loaded_by(modules: list[str], also: frozenset[str] = frozenset()) -> list[str]:
    """The shell packages and provider modules in a fresh interpreter's ``sys.modules``
    once it has imported ``modules``: what the import graph really pulls in, which the
    rules above (a module's own import lines) cannot see."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"shell = {sorted(SHELL_PACKAGES | also)!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in shell\n"
        "    or m.startswith('gateway.providers'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    found: list[str] = json.loads(done.stdout)
    return found


def test_importing_the_core_loads_no_shell_package_or_provider():
    core = sorted(module_name(path) for path in GATEWAY if folder(module_name(path)) in PURE_LAYERS)
    assert "gateway.core.session" in core
    assert "gateway.wire.v1" in core
    assert loaded_by(core) == []


def test_importing_the_session_loads_no_jsonschema_asyncio_httpx_or_structlog():
    """jsonschema (82 of 226 ms of the import) loads at the first schema checked."""
    assert loaded_by(["gateway.core.session"], also=frozenset({"jsonschema", "re2"})) == []


def test_importing_providers_loads_no_adapter():
    """The registry is lazy: an adapter (and httpx with it) loads when one is built."""
    found = loaded_by(["gateway.providers", "gateway.providers.base"])
    assert found == ["gateway.providers", "gateway.providers.base"]

"""Import rules of STYLE.md: a pure core, Starlette and uvicorn only at the edges."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MODULES = sorted([*ROOT.glob("gateway/**/*.py"), *ROOT.glob("client_sdk/**/*.py")])

# The core may use only the stdlib and these; and none of the I/O or clock modules.
PURE = {
    "gateway/admission.py",
    "gateway/protocol.py",
    "gateway/session.py",
    "gateway/dispatch.py",
    "gateway/event.py",
    "gateway/outbox.py",
    "gateway/outqueue.py",
    "gateway/call.py",
    "gateway/transcript.py",
    "gateway/history.py",
    "gateway/errors.py",
    "gateway/config.py",
    "gateway/tools.py",
    "gateway/schema.py",
    "gateway/principal.py",
    "gateway/schema_guard.py",
    "gateway/providers/base.py",
}
# referencing is jsonschema's own resolver; re2 runs client regexes in linear time.
PURE_THIRD_PARTY = {"msgspec", "jsonschema", "referencing", "re2"}
NO_IO = {
    "gateway/admission.py",
    "gateway/protocol.py",
    "gateway/session.py",
    "gateway/dispatch.py",
    "gateway/event.py",
    "gateway/outbox.py",
    "gateway/outqueue.py",
    "gateway/call.py",
    "gateway/transcript.py",
    "gateway/history.py",
    "gateway/errors.py",
    "gateway/principal.py",
    "gateway/schema_guard.py",
    "gateway/providers/base.py",
}
IO_MODULES = {"asyncio", "socket", "time", "os", "random", "secrets", "threading", "select"}
EDGES = {
    "starlette": {
        "gateway/transport.py",
        "gateway/app.py",
        "gateway/auth_http.py",
        "gateway/body.py",
    },
    "uvicorn": {"gateway/__main__.py", "gateway/server.py"},
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_module_respects_the_import_rules(path: Path):
    name = rel(path)
    tops = {top(module) for module in imports(path)}
    if name in PURE:
        third_party = tops - set(sys.stdlib_module_names) - {"gateway", "__future__"}
        assert third_party <= PURE_THIRD_PARTY, f"{name} imports {third_party}"
    if name in NO_IO:
        assert not tops & IO_MODULES, f"{name} does I/O or reads a clock: {tops & IO_MODULES}"
    for library, allowed in EDGES.items():
        if library in tops:
            assert name in allowed, f"{library} may appear only in {sorted(allowed)}"
    if name.startswith("client_sdk/"):
        from_gateway = {m for m in imports(path) if top(m) == "gateway"}
        assert from_gateway <= {"gateway.protocol", "gateway.errors"}, from_gateway


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_module_declares_all(path: Path):
    tree = ast.parse(path.read_text())
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    assert "__all__" in assigned, f"{rel(path)} has no __all__"

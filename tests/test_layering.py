"""Import rules of STYLE.md: a pure core, Starlette and uvicorn only at the edges."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
MODULES = sorted([*ROOT.glob("gateway/**/*.py"), *ROOT.glob("client_sdk/**/*.py")])

# The core may use only the stdlib and these; and none of the I/O or clock modules.
PURE = {
    "gateway/admission.py",
    "gateway/codec.py",
    "gateway/openai_frames.py",
    "gateway/openai_realtime.py",
    "gateway/openai_wire.py",
    "gateway/protocol.py",
    "gateway/session.py",
    "gateway/session_settings.py",
    "gateway/responses.py",
    "gateway/toolset.py",
    "gateway/dispatch.py",
    "gateway/event.py",
    "gateway/outbox.py",
    "gateway/outqueue.py",
    "gateway/call.py",
    "gateway/transcript.py",
    "gateway/history.py",
    "gateway/model.py",
    "gateway/state.py",
    "gateway/routing.py",
    "gateway/text.py",
    "gateway/errors.py",
    "gateway/config.py",
    "gateway/tools.py",
    "gateway/schema.py",
    "gateway/principal.py",
    "gateway/schema_guard.py",
    "gateway/providers/base.py",
    "gateway/segments.py",
    "gateway/closing.py",
    "gateway/requests.py",
    "gateway/domain.py",
    "gateway/tool_choice.py",
    "gateway/confirm.py",
    "gateway/widget.py",
}
# referencing is jsonschema's own resolver; re2 runs client regexes in linear time.
PURE_THIRD_PARTY = {"msgspec", "jsonschema", "referencing", "re2"}
NO_IO = {
    "gateway/admission.py",
    "gateway/codec.py",
    "gateway/openai_frames.py",
    "gateway/openai_realtime.py",
    "gateway/openai_wire.py",
    "gateway/protocol.py",
    "gateway/session.py",
    "gateway/session_settings.py",
    "gateway/responses.py",
    "gateway/toolset.py",
    "gateway/dispatch.py",
    "gateway/event.py",
    "gateway/outbox.py",
    "gateway/outqueue.py",
    "gateway/call.py",
    "gateway/transcript.py",
    "gateway/history.py",
    "gateway/model.py",
    "gateway/state.py",
    "gateway/routing.py",
    "gateway/text.py",
    "gateway/errors.py",
    "gateway/principal.py",
    "gateway/tools.py",
    "gateway/schema_guard.py",
    "gateway/providers/base.py",
    "gateway/segments.py",
    "gateway/closing.py",
    "gateway/requests.py",
    "gateway/domain.py",
    "gateway/tool_choice.py",
    "gateway/confirm.py",
    "gateway/widget.py",
}
IO_MODULES = {"asyncio", "socket", "time", "os", "random", "secrets", "threading", "select"}
# Providers import the core's vocabulary (gateway.model), never the other way.
CORE = {name for name in PURE if not name.startswith("gateway/providers/")}
# What the core must not load, even through another module's imports.
SHELL_PACKAGES = {
    *("httpx", "asyncio", "structlog", "starlette", "uvicorn", "prometheus_client", "redis"),
}
EDGES = {
    "starlette": {
        "gateway/transport.py",
        "gateway/app.py",
        "gateway/auth_http.py",
        "gateway/body.py",
        "gateway/openai_endpoint.py",
    },
    "uvicorn": {"gateway/__main__.py", "gateway/server.py"},
    "redis": {"gateway/redis_store.py"},
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
    if name in CORE:
        providers = {m for m in imports(path) if m.startswith("gateway.providers")}
        assert not providers, f"{name} imports {providers}: the core owns its vocabulary"
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


def loaded_by(modules: list[str]) -> list[str]:
    """The shell packages and provider modules in a fresh interpreter's ``sys.modules``
    once it has imported ``modules``: what the import graph really pulls in, which the
    rules above (a module's own import lines) cannot see."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"shell = {sorted(SHELL_PACKAGES)!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in shell\n"
        "    or m.startswith('gateway.providers'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    found: list[str] = json.loads(done.stdout)
    return found


def test_importing_the_core_loads_no_shell_package_or_provider():
    core = sorted(name.removesuffix(".py").replace("/", ".") for name in CORE)
    assert "gateway.session" in core
    assert loaded_by(core) == []


def test_importing_providers_loads_no_adapter():
    """The registry is lazy: an adapter (and httpx with it) loads when one is built."""
    found = loaded_by(["gateway.providers", "gateway.providers.base"])
    assert found == ["gateway.providers", "gateway.providers.base"]

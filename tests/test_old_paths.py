"""The import paths users were first told about keep working after the move into layer
folders (docs/architecture.md): each is a plain re-export of where the names live now."""

from __future__ import annotations

import importlib

import pytest

OLD_PATHS = {
    "gateway.protocol": ("gateway.wire.v1", ["SessionStart", "ToolResult", "decode_client"]),
    "gateway.server_tool": ("gateway.tools.python", ["tool", "Progress", "PythonTools"]),
    "gateway.confirm": ("gateway.core.confirm", ["Approve", "Deny", "ConfirmRule"]),
    "gateway.store": ("gateway.store.memory", ["MemoryStore"]),
    "gateway.agent": ("gateway.agent.file", ["Agent", "load_agent", "load_crew", "DEMO_AGENT"]),
    "gateway.tools": ("gateway.core.tool", ["ToolDef", "ToolRegistry", "check_tool"]),
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_gives_the_same_objects_as_their_new_home(old: str):
    new, names = OLD_PATHS[old]
    before, after = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(after, name), f"{old}.{name}"


def test_the_old_protocol_path_exports_everything_v1_does():
    v1 = importlib.import_module("gateway.wire.v1")
    protocol = importlib.import_module("gateway.protocol")
    assert protocol.__all__ == v1.__all__
    assert all(getattr(protocol, name) is getattr(v1, name) for name in v1.__all__)


def test_gateway_errors_keeps_the_names_clients_use():
    errors = importlib.import_module("gateway.errors")
    for name in ("GatewayError", "CloseCode", "ProviderError", "ToolError", "ToolForbidden"):
        assert hasattr(errors, name), name

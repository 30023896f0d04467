"""How server tools run: the ``ToolBackend`` seam (``base``), the ``Toolbox`` that puts an
agent's backends together (``toolbox``), what an agent file says about a backend (``entry``);
Python functions (``python``), MCP servers (``mcp``), OpenAPI documents (``openapi``), built-in
system tools (``system``) and other agents (``agent``).

What a tool *is* lives in the core (``gateway.core.tool``). Its names are re-exported here,
where they were first documented (``gateway.tools.ToolDef``), with ``Progress``; each is
loaded when first asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.core.tool import (
        Delivery,
        Execution,
        Kind,
        ToolDef,
        ToolEntry,
        ToolRegistry,
        check_tool,
        default_display_name,
    )
    from gateway.tools.python import Progress

__all__ = [
    "Delivery",
    "Execution",
    "Kind",
    "Progress",
    "ToolDef",
    "ToolEntry",
    "ToolRegistry",
    "check_tool",
    "default_display_name",
]

_LAZY = {name: "gateway.core.tool" for name in __all__} | {"Progress": "gateway.tools.python"}


if not TYPE_CHECKING:  # mypy sees the imports above; a __getattr__ would make any name Any

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

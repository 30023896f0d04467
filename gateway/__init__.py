"""Realtime WebSocket conversation gateway.

A tool author's names come from here: ``from gateway import tool, Progress, Caller,
ToolForbidden, Approve, Deny``. They are loaded when first asked for, so importing
``gateway`` (as every ``gateway.*`` import does) loads none of the modules behind them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.core.confirm import Approve, Deny
    from gateway.errors import ToolForbidden
    from gateway.tools.base import Caller
    from gateway.tools.python import Progress, tool

__all__ = ["Approve", "Caller", "Deny", "Progress", "ToolForbidden", "__version__", "tool"]

__version__ = "0.1.0"

_LAZY = {
    "tool": "gateway.tools.python",
    "Progress": "gateway.tools.python",
    "Caller": "gateway.tools.base",
    "ToolForbidden": "gateway.errors",
    "Approve": "gateway.core.confirm",
    "Deny": "gateway.core.confirm",
}
"""Each re-exported name and the module it lives in."""


if not TYPE_CHECKING:  # mypy sees the imports above; a __getattr__ would make any name Any

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # the next lookup finds it without this function
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})

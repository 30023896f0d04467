"""The names ``gateway.tools.backend`` held before it split in three, from their new homes.

- ``gateway.tools.base``: the ``ToolBackend`` seam, ``Caller`` and ``NOBODY``, what a tool's
  failure looks like (``tool_failure``, ``failure_code``), ``tool_name``.
- ``gateway.tools.toolbox``: the ``Toolbox`` (an agent's backends under unique names), ``ToolRow``.
- ``gateway.tools.entry``: what an agent file says about a backend (``McpServerEntry``,
  ``OpenApiEntry``, ``AgentToolEntry``, ``ToolOptions``), ``EntryBackend``, ``with_options``,
  ``check_options_known``, ``expand_env``.

A plain re-export, kept while code written against this path moves to those modules; new code
imports from them.
"""

from gateway.tools.base import (
    NOBODY,
    BackendKind,
    Caller,
    ReportProgress,
    ToolBackend,
    failure_code,
    tool_failure,
    tool_name,
)
from gateway.tools.entry import (
    AgentToolEntry,
    EntryBackend,
    McpServerEntry,
    OpenApiEntry,
    ToolOptions,
    check_options_known,
    expand_env,
    with_options,
)
from gateway.tools.toolbox import Toolbox, ToolRow

__all__ = [
    "NOBODY",
    "AgentToolEntry",
    "BackendKind",
    "Caller",
    "EntryBackend",
    "McpServerEntry",
    "OpenApiEntry",
    "ReportProgress",
    "ToolBackend",
    "ToolOptions",
    "ToolRow",
    "Toolbox",
    "check_options_known",
    "expand_env",
    "failure_code",
    "tool_failure",
    "tool_name",
    "with_options",
]

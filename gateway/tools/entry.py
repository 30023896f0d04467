"""What an agent file says about a tool backend: its entry (``[[mcp_servers]]``,
``[[openapi]]``, ``[[a2a_agents]]``, ``[[agent_tools]]``), the options it sets on a backend's
tools, and the ``${VAR}`` in its values that the gateway's environment fills in.

The backends read their entries (``tools.mcp``, ``tools.openapi``, ``tools.a2a``,
``tools.agent``); the agent
file's own format, which lists them, is ``gateway.agent.spec``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Annotated

import msgspec

from gateway.core.tool import Delivery, Execution, ToolDef
from gateway.errors import ConfigError
from gateway.tools.base import BackendKind

__all__ = [
    "A2AAgentEntry",
    "AgentToolEntry",
    "EntryBackend",
    "McpServerEntry",
    "OpenApiEntry",
    "ToolOptions",
    "check_options_known",
    "expand_env",
    "with_options",
]


class ToolOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an agent file may set on one tool of a backend (``tool_options.NAME``)."""

    execution: Execution | None = None
    delivery: Delivery | None = None
    timeout: float | None = None
    display_name: str | None = None
    scopes: list[str] | None = None
    """Scopes the session's user must all have for a call to run."""
    confirm: bool | None = None
    """A call runs only once the user (or ``confirm_rule``) approved it."""
    confirm_prompt: str | None = None
    """What the user is asked, with ``{arg}`` placeholders."""
    confirm_rule: str | None = None
    """``module:function`` or ``file.py:function`` deciding without asking (docs/tools.md)."""


_BackendName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]


class McpServerEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An MCP server whose tools the agent offers (``[[mcp_servers]]`` in an agent file):
    a stdio ``command`` the gateway starts, or a streamable-HTTP ``url``."""

    name: _BackendName
    """Names the backend (``mcp:NAME``) and prefixes its tools' names where they clash."""
    command: list[str] = []
    """stdio: the program and its arguments, run in ``cwd``."""
    env: dict[str, str] = {}
    """stdio: variables added to the gateway's environment for the server; ``${VAR}`` in a
    value is the gateway's own variable."""
    cwd: str | None = None
    """stdio: the server's working directory, relative to the agent file's (the default)."""
    url: str | None = None
    """Streamable HTTP: the server's endpoint, e.g. ``http://127.0.0.1:9000/mcp``."""
    headers: dict[str, str] = {}
    """Streamable HTTP: sent with every request; ``${VAR}`` in a value is the gateway's
    environment variable (``Authorization = "Bearer ${FILES_TOKEN}"``)."""
    optional: bool = False
    """Unreachable at startup: a warning (and retried in the background), not an error."""
    connect_timeout: float = 10.0
    """Seconds to connect and list the tools."""
    timeout: float | None = None
    """Seconds a call of its tools may take; ``None`` takes the gateway's server-tool one."""
    tools: list[str] | None = None
    """Only these tools (the server's names); ``None`` offers all."""
    tool_options: dict[str, ToolOptions] = {}
    """By the server's tool name: execution, delivery, timeout, display name."""


class OpenApiEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An HTTP API described by an OpenAPI 3.x document (``[[openapi]]`` in an agent file):
    each operation is a tool."""

    name: _BackendName
    """Names the backend (``openapi:NAME``) and prefixes its tools' names where they clash."""
    document: str
    """A JSON or YAML file (relative to the agent file) or an ``http(s)://`` URL."""
    base_url: str | None = None
    """Where calls go; by default the document's first ``servers`` URL (resolved against
    the document's own URL)."""
    operations: list[str] | None = None
    """Only these operations (``operationId``, or ``METHOD /path``); ``None`` offers all."""
    headers: dict[str, str] = {}
    """Sent with every call; ``${VAR}`` in a value is the gateway's environment variable."""
    timeout: float = 10.0
    """Seconds one HTTP call may take."""
    optional: bool = False
    """Unreachable document at startup: a warning, not an error."""
    tool_options: dict[str, ToolOptions] = {}
    """By the tool's name (as the gateway names the operation): execution, delivery,
    timeout, display name."""


class A2AAgentEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A remote agent spoken to over A2A (``[[a2a_agents]]`` in an agent file): each skill
    its agent card lists is a tool whose input is the message to send."""

    name: _BackendName
    """Names the backend (``a2a:NAME``) and prefixes its tools' names where they clash."""
    url: str
    """Its agent card (a URL ending in ``.json``), or the agent's base URL, whose
    ``/.well-known/agent-card.json`` is fetched."""
    headers: dict[str, str] = {}
    """Sent with every request (the card's too); ``${VAR}`` in a value is the gateway's
    environment variable (``Authorization = "Bearer ${BILLING_TOKEN}"``)."""
    skills: list[str] | None = None
    """Only these skills (the card's skill ids); ``None`` offers all."""
    optional: bool = False
    """Unreachable card at startup: a warning (and fetched again in the background), not an
    error."""
    connect_timeout: float = 10.0
    """Seconds to fetch the card."""
    timeout: float | None = None
    """Seconds a call of its skills may take; ``None`` takes the gateway's server-tool one."""
    sync_budget: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    """Seconds a sync call waits for a task that keeps working; past them, the call turns
    async (``pending``, the turn goes on, the result comes later as a completion)."""
    tool_options: dict[str, ToolOptions] = {}
    """By the tool's name (as the gateway names the skill): execution (``async`` for a
    long-running task), delivery, timeout, display name."""


class AgentToolEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Another agent offered as a tool (``[[agent_tools]]`` in an agent file): calling it
    runs that agent's turn to completion and returns its final text."""

    name: _BackendName
    """The tool's name (and the backend's: ``agent:NAME``)."""
    file: str
    """The other agent's file, relative to this one."""
    description: Annotated[str, msgspec.Meta(min_length=1)]
    """What the model reads: what to ask this agent for."""
    display_name: str | None = None
    execution: Execution = "sync"
    """``async`` for an agent whose turn takes long: the model gets pending at once."""
    timeout: float | None = None
    """Seconds its whole turn may take; ``None`` takes the gateway's server-tool one."""
    max_steps: Annotated[int, msgspec.Meta(ge=1, le=50)] = 8
    """Model steps its turn may take."""
    optional: bool = False
    """A file that cannot be loaded (or whose tools cannot start): a warning, not an error."""


class EntryBackend:
    """What a backend an agent file names (an MCP server, an OpenAPI document, a remote A2A
    agent) is called:
    ``KIND:NAME``, its tools prefixed with ``NAME`` on a clash, optional as the file says."""

    kind: BackendKind

    def __init__(
        self, entry: McpServerEntry | OpenApiEntry | A2AAgentEntry | AgentToolEntry
    ) -> None:
        self._named = entry

    @property
    def name(self) -> str:
        return f"{self.kind}:{self._named.name}"

    @property
    def prefix(self) -> str:
        return self._named.name

    @property
    def optional(self) -> bool:
        return self._named.optional


def with_options(definition: ToolDef, options: ToolOptions | None) -> ToolDef:
    """``definition`` with what the agent file sets for it."""
    if options is None:
        return definition
    changes = {
        field: value
        for field in (
            "execution",
            "delivery",
            "timeout",
            "display_name",
            "confirm",
            "confirm_prompt",
            "confirm_rule",
        )
        if (value := getattr(options, field)) is not None
    }
    if options.scopes is not None:
        changes["scopes"] = tuple(options.scopes)
    return msgspec.structs.replace(definition, **changes) if changes else definition


def check_options_known(
    backend: str, options: Mapping[str, ToolOptions], offered: Sequence[str]
) -> None:
    """A ``tool_options`` entry for a tool the backend does not offer is a mistake.

    Raises:
        ConfigError: naming the backend and the tool.
    """
    for name in options:
        if name not in offered:
            raise ConfigError(
                f"{backend}: tool_options names {name!r}, which it does not offer"
                f" (it offers: {', '.join(sorted(offered)) or 'nothing'})"
            )


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(value: str, where: str, environ: Mapping[str, str] | None = None) -> str:
    """``value`` with each ``${NAME}`` replaced by that environment variable, so secrets
    stay out of agent files (``Authorization = "Bearer ${SHOP_TOKEN}"``).

    Raises:
        ConfigError: a variable is not set; ``where`` says whose value it is.
    """
    env = os.environ if environ is None else environ

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        return env[name]

    return _VARIABLE.sub(replace, value)

"""The agent file's format: the Structs an agent TOML file decodes into (``AgentFile``).

Decoding checks the shape (``forbid_unknown_fields``: a typo fails at startup); what the
entries name (modules, files, servers) is checked when ``gateway.agent.file`` loads them. The
entries of tool backends (``[[mcp_servers]]``, ``[[openapi]]``, ``[[a2a_agents]]``,
``[[agent_tools]]``) are the
backends' own (``gateway.tools.entry``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from gateway.providers import ModelSettings
from gateway.tools.entry import A2AAgentEntry, AgentToolEntry, McpServerEntry, OpenApiEntry
from gateway.tools.system import SystemToolName
from gateway.wire.v1 import Widget

__all__ = ["AgentFile", "ClientFunctionEntry", "ServerToolEntry", "TransferEntry"]


class ClientFunctionEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A function the client runs (``[[client_functions]]``): the model calls it, the client
    answers."""

    name: str
    description: str
    input_schema: dict[str, Any] = msgspec.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    output_schema: dict[str, Any] | None = None
    display_name: str | None = None
    timeout: float | None = None
    confirm: bool = False
    """The call goes to the client only once the user approved it (docs/tools.md)."""
    confirm_prompt: str | None = None
    confirm_rule: str | None = None
    widget: Widget | None = None
    """A widget tool: the user answers its calls (a choice, yes/no, a form)."""


class ServerToolEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A Python function decorated with ``@tool`` (``[[server_tools]]``), and what the file
    sets on it."""

    ref: str
    """``package.module:name`` or ``file.py:name`` (relative to the agent file)."""
    timeout: float | None = None
    delivery: Literal["when_idle", "interrupt", "silent"] | None = None
    """Async tools: overrides the delivery set in ``@tool``."""
    scopes: list[str] | None = None
    """Scopes the session's user must all have; overrides those set in ``@tool``."""
    confirm: bool | None = None
    """A call runs only once the user approved it; overrides ``@tool``."""
    confirm_prompt: str | None = None
    """What the user is asked, with ``{arg}`` placeholders; overrides ``@tool``."""
    confirm_rule: str | None = None
    """``module:function`` or ``file.py:function`` that may decide without asking."""


class TransferEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An agent the conversation may be handed to (``transfer_to_agent``)."""

    file: str
    """Its agent file, relative to this one; the model knows it by that file's ``name``."""
    description: Annotated[str, msgspec.Meta(min_length=1)]
    """What the model reads: when to hand the user over to it."""


_Prompt = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class AgentFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An agent TOML file, as written: its name, instructions, model and tools."""

    name: str
    description: str = ""
    """What the agent does, in a sentence or two: its A2A card says it (docs/a2a.md)."""
    instructions: str = ""
    model: ModelSettings = ModelSettings()
    server_tools: list[ServerToolEntry] = []
    client_functions: list[ClientFunctionEntry] = []
    mcp_servers: list[McpServerEntry] = []
    """MCP servers whose tools the agent offers (docs/tools.md)."""
    openapi: list[OpenApiEntry] = []
    """HTTP APIs described by OpenAPI documents, each operation a tool (docs/tools.md)."""
    a2a_agents: list[A2AAgentEntry] = []
    """Remote agents spoken to over A2A, each skill a tool (docs/tools.md)."""
    confirm_mcp_writes: bool = False
    """Every MCP tool not annotated read-only needs the user's confirmation."""
    agent_tools: list[AgentToolEntry] = []
    """Other agents offered as tools (docs/tools.md)."""
    system_tools: list[SystemToolName] = []
    """Built-in tools to offer, by name: ``get_current_time``..."""
    transfers: list[TransferEntry] = []
    """The agents ``transfer_to_agent`` may hand the conversation to."""
    suggestions: Annotated[list[_Prompt], msgspec.Meta(max_length=12)] = []
    """Example prompts a chat page offers (the web demo's suggestion chips)."""
    notify_url: str | None = None
    """A webhook the gateway POSTs a signed notice to when an event wants the user's
    attention while no socket is attached (docs/mobile.md): ``https://``, or ``http://``
    to localhost only."""
    notify_secret_env: str | None = None
    """The environment variable holding the notices' HMAC secret (required with
    ``notify_url``; the secret itself never goes in the file)."""
    a2a: bool = False
    """Serve this agent over A2A as well: its agent card and a JSON-RPC endpoint
    (docs/a2a.md); ``gateway serve --a2a`` turns it on too."""

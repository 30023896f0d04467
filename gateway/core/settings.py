"""What a session is built from: ``SessionSettings``, and ``AgentProfile`` for hand-overs.

Part of the pure session core: plain values, no I/O. The application builds the settings
once per session (the agent, its tools, the limits in force, the principal); a session
handed to another agent (``transfer_to_agent``) takes that agent's ``AgentProfile`` in
place of its own parts, and keeps the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.core.confirm import ConfirmRule
from gateway.core.outbound import Limits
from gateway.core.principal import ANONYMOUS, Principal
from gateway.core.schema_guard import SchemaGuard
from gateway.core.tool import ToolRegistry

__all__ = ["AgentProfile", "SessionSettings"]


@dataclass(frozen=True, kw_only=True)
class AgentProfile:
    """What a session takes from an agent it is handed to (``transfer_to_agent``)."""

    agent: str
    instructions: str
    tools: ToolRegistry
    model_supports_tools: bool = True
    model_supports_tool_choice: bool = True
    confirm_rules: Mapping[str, ConfirmRule] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SessionSettings:
    """What a session is built from: the agent and the limits in force."""

    agent: str
    instructions: str
    tools: ToolRegistry
    model_supports_tools: bool
    limits: Limits
    server_tool_timeout: float
    principal: Principal = ANONYMOUS
    """Who the session belongs to: the client functions they may declare, the end
    user's claims (kept for tools)."""
    schema_guard: SchemaGuard | None = None
    """Limits and cache for the schemas of client functions; ``None`` checks them in full
    with no limits (for trusted callers only)."""
    max_history_chars: int | None = None
    """The history budget (``Config.max_history_chars``); ``None`` keeps every turn."""
    model_supports_tool_choice: bool = True
    """The model honours ``tool_choice`` (``gateway.core.tool_choice``)."""
    confirm_rules: Mapping[str, ConfirmRule] = dataclasses.field(default_factory=dict)
    """The rules tools name in ``confirm_rule`` (``gateway.core.confirm``), by reference."""
    agents: Callable[[str], AgentProfile | None] = lambda _: None
    """The agents a session may be handed to, by name (their tools as they are now)."""
    voices: tuple[str, ...] = ()
    """The voices the gateway's speech engines have, the default first; none: a session
    cannot turn audio on (``gateway.core.audio``)."""

    def switched(self, profile: AgentProfile) -> SessionSettings:
        """These settings with ``profile``'s agent in place of this one."""
        return dataclasses.replace(
            self,
            agent=profile.agent,
            instructions=profile.instructions,
            tools=profile.tools,
            model_supports_tools=profile.model_supports_tools,
            model_supports_tool_choice=profile.model_supports_tool_choice,
            confirm_rules=profile.confirm_rules,
        )

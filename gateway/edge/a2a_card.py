"""The agent card of an agent served over A2A (``GET /.well-known/agent-card.json``).

Made anew for each request, from the agent as it is then (an MCP server may change its
tools) and the URL the card is asked at (or ``public_url``): one JSON-RPC interface at
``<base>/a2a``, streaming, text in and out, and the skills. Each server tool the model may
call is a skill (id: its name); one more skill, ``talk-to-agent``, is the agent as a whole.
Client functions run in the user's app, which an A2A conversation has not: they are left
out, and the card's description says so (a caller that makes a tool of every skill, as the
gateway's own ``[[a2a_agents]]`` does, would otherwise get tools that always fail). The
system tools that end or hand over the session are left out too: they are the agent's
own moves, not things to ask for.
"""

from __future__ import annotations

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)

from gateway import __version__
from gateway.agent.file import Agent
from gateway.core.tool import ToolDef

__all__ = ["A2A_PATH", "AGENT_SKILL_ID", "SECURITY_SCHEME", "agent_card", "client_functions"]

A2A_PATH = "/a2a"
"""Where the JSON-RPC endpoint is, under the gateway's base URL."""
AGENT_SKILL_ID = "talk-to-agent"
"""The skill of the agent as a whole. A tool's name is snake_case, so no tool's skill can
take this id."""
SECURITY_SCHEME = "bearer"
"""The card's name for the gateway's credential: ``Authorization: Bearer <API key>``."""
_TEXT = "text/plain"


def agent_card(agent: Agent, base_url: str, *, auth_required: bool) -> AgentCard:
    """The card of ``agent``, served at ``base_url`` (no trailing slash).

    Args:
        agent: the agent the gateway serves.
        base_url: the gateway's base URL, as callers reach it.
        auth_required: every call needs an API key (the gateway's auth is on); the card
            then requires the bearer scheme it lists.
    """
    description = agent.description or f"The {agent.name!r} agent."
    if away := client_functions(agent):
        description += (
            f" Its functions that run in the user's app ({', '.join(sorted(away))}) are not"
            " available over A2A: no app takes part in an A2A conversation."
        )
    scheme = SecurityScheme(
        http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer",
            description="A gateway API key (or a client token the gateway minted).",
        )
    )
    return AgentCard(
        name=agent.name,
        description=description,
        version=__version__,
        supported_interfaces=[
            AgentInterface(
                url=f"{base_url}{A2A_PATH}", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        security_schemes={SECURITY_SCHEME: scheme},
        security_requirements=(
            [SecurityRequirement(schemes={SECURITY_SCHEME: StringList()})] if auth_required else []
        ),
        default_input_modes=[_TEXT],
        default_output_modes=[_TEXT],
        skills=[_agent_skill(agent, description), *map(_tool_skill, served_tools(agent))],
    )


def served_tools(agent: Agent) -> list[ToolDef]:
    """The agent's tools an A2A caller may ask for by skill: its server tools, but the
    system tools that end the session or hand it over."""
    return [
        d
        for d in agent.tools.definitions()
        if d.kind == "server" and not d.ends_session and not d.transfers
    ]


def client_functions(agent: Agent) -> list[str]:
    """The names of the agent's client functions: they cannot run over A2A."""
    return [d.name for d in agent.tools.definitions() if d.kind == "client"]


def _agent_skill(agent: Agent, description: str) -> AgentSkill:
    return AgentSkill(
        id=AGENT_SKILL_ID,
        name=agent.name,
        description=f"Talk to the agent: one message, one answer. {description}",
        tags=["conversation"],
        examples=list(agent.suggestions),
        input_modes=[_TEXT],
        output_modes=[_TEXT],
    )


def _tool_skill(definition: ToolDef) -> AgentSkill:
    tags = ["tool", definition.execution]
    if definition.confirm:
        # No user takes part to approve it: the agent is told it was declined.
        tags.append("needs-approval")
    return AgentSkill(
        id=definition.name,
        name=definition.display_name or definition.name,
        description=definition.description,
        tags=tags,
        input_modes=[_TEXT],
        output_modes=[_TEXT],
    )

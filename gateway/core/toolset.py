"""A session's tools: the agent's, from the session's settings, plus the client's own.

Part of the pure session core: no I/O, and nothing here sends anything. ``Toolset`` owns
the settings the tools come from (another agent's after ``transfer_to_agent``) and the
client's function specs as accepted. It builds the registry the dispatcher runs calls
from, and says why when it cannot be built or asked of: a function the client's token does
not allow, an invalid or clashing one, a model that cannot call tools, a ``tool_choice`` or
``max_steps`` that cannot be honoured. The session turns that into an ``error``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway.core.inbound import ToolSpec
from gateway.core.outbound import ToolInfo
from gateway.core.settings import AgentProfile, SessionSettings
from gateway.core.tool import ToolDef, ToolRegistry, default_display_name
from gateway.core.tool_choice import choice_problem, narrowing_problem, steps_problem
from gateway.errors import ConfigError

__all__ = ["Refusal", "Toolset", "tool_infos"]


class Refusal(NamedTuple):
    """Why a client's declaration is refused: the ``error`` event's code and message."""

    code: str
    message: str


class Toolset:
    """The settings a session's tools come from, and the client's own functions."""

    __slots__ = ("client_specs", "settings")

    def __init__(self, settings: SessionSettings, client_specs: list[ToolSpec]) -> None:
        self.settings = settings
        """The settings of the agent the session is with (another after a transfer)."""
        self.client_specs = client_specs
        """The client's own functions, as accepted (kept in the state)."""

    def accepted(self, specs: list[ToolSpec]) -> ToolRegistry | Refusal:
        """The agent's tools plus the client's functions among ``specs``, or why not.

        A client may declare a function the agent already declares as a client
        function: it says it implements it, and the agent's declaration stands.
        """
        refusal = self._denied(self.own(specs))
        if refusal is not None:
            return refusal
        try:
            tools = self.registry(specs)
        except ConfigError as exc:
            return Refusal("invalid_message", f"client_functions: {exc}")
        if len(tools) and not self.settings.model_supports_tools:
            return Refusal("invalid_message", "this agent's model cannot call tools")
        return tools

    def registry(self, specs: list[ToolSpec]) -> ToolRegistry:
        """The agent's tools plus the client's own functions among ``specs`` (kept whole:
        after a transfer, another agent may not declare the same client functions).

        Raises:
            ConfigError: a client function is invalid (its name, its schemas).
        """
        allowed = self.settings.principal.client_functions
        client_defs = [
            ToolDef(
                name=spec.name,
                description=spec.description,
                kind="client",
                input_schema=spec.input_schema,
                output_schema=spec.output_schema,
                display_name=spec.display_name or default_display_name(spec.name),
                timeout=spec.timeout,
                widget=spec.widget,
            )
            for spec in self.own(specs)
            if allowed is None or spec.name in allowed  # after a transfer: see _denied
        ]
        return self.settings.tools.extended(client_defs, self.settings.schema_guard)

    def _denied(self, specs: list[ToolSpec]) -> Refusal | None:
        """Why the principal may not declare these client functions, or ``None`` (the
        agent's own client functions are always allowed: declaring them adds nothing)."""
        allowed = self.settings.principal.client_functions
        denied = sorted({s.name for s in specs} - allowed) if allowed is not None else []
        if not denied:
            return None
        names = ", ".join(repr(name[:64]) for name in denied[:8])
        return Refusal("forbidden", f"client_functions: this client's token does not allow {names}")

    def own(self, specs: list[ToolSpec]) -> list[ToolSpec]:
        """The client's own functions: those the agent does not declare as client functions."""
        agent_tools = self.settings.tools
        return [
            spec
            for spec in specs
            if not ((known := agent_tools.get(spec.name)) and known.definition.kind == "client")
        ]

    def declared_schemas(self, specs: list[ToolSpec]) -> list[dict[str, Any]]:
        """The schemas among ``specs`` that ``registry`` will check, in the order it checks
        them."""
        return [
            schema
            for spec in self.own(specs)
            for schema in (spec.input_schema, spec.output_schema)
            if schema is not None
        ]

    def choice_problem(
        self,
        tools: ToolRegistry,
        choice: str | None,
        max_steps: int | None,
        narrowed: list[str] | None,
    ) -> str | None:
        """Why a ``tool_choice``, ``max_steps`` and ``tools`` narrowing asked for cannot be
        honoured with ``tools``, or ``None`` when they can."""
        if choice in (None, "auto", "none") and max_steps is None and narrowed is None:
            return None  # most messages ask for nothing: no list of every tool to build
        settings = self.settings
        names = [d.name for d in tools.definitions()]
        offered = names if narrowed is None else [n for n in names if n in narrowed]
        return (
            narrowing_problem(narrowed, names)
            or choice_problem(
                choice,
                offered,
                supports_tools=settings.model_supports_tools,
                supports_choice=settings.model_supports_tool_choice,
            )
            or steps_problem(max_steps, settings.limits.max_steps)
        )

    def handed_to(self, profile: AgentProfile) -> tuple[Toolset, ToolRegistry]:
        """This toolset with ``profile``'s agent in place of this one, and its registry
        with the client's functions (whether ``profile``'s model can call them is the
        caller's to check).

        Raises:
            ConfigError: a client function clashes with one of the agent's tools.
        """
        toolset = Toolset(self.settings.switched(profile), self.client_specs)
        return toolset, toolset.registry(self.client_specs)


def tool_infos(tools: ToolRegistry) -> list[ToolInfo]:
    """What the client is told of ``tools`` (``session.created`` and the like)."""
    return [
        ToolInfo(
            name=d.name,
            kind=d.kind,
            execution=d.execution,
            delivery=d.delivery if d.execution == "async" else None,
            display_name=d.display_name or default_display_name(d.name),
            description=d.description,
        )
        for d in tools.definitions()
    ]

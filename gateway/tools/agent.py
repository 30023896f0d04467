"""Another agent as a tool (``[[agent_tools]]`` in an agent file), as a ``ToolBackend``.

Calling the tool runs the other agent's own turn, with its instructions, model and server
tools, to completion, and returns its final text as the result. The conversation is not
handed over: the other agent's text is not streamed as the answer, and the client sees the
call's lifecycle, with a progress report for each of the other agent's model steps and
tool calls. Its client functions are not offered to it (no client would run them).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
import structlog

from gateway.core.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    ToolSchema,
)
from gateway.core.tool import ToolDef, ToolRegistry, default_display_name
from gateway.core.transcript import AssistantTurn, Item, RequestedCall, ToolOutcome, UserTurn
from gateway.errors import ConfigError, ProviderError, ToolError
from gateway.tools.base import NOBODY, BackendKind, Caller, ReportProgress, tool_failure
from gateway.tools.entry import AgentToolEntry, EntryBackend
from gateway.tools.toolbox import Toolbox

__all__ = ["AgentLoader", "AgentTools", "OtherAgent"]

log = structlog.get_logger("gateway.tools")

_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"request": {"type": "string", "description": "What to ask the agent, in full."}},
    "required": ["request"],
    "additionalProperties": False,
}
_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}


class _Model(Protocol):
    """What the tool needs of the other agent's model (a ``providers.base.Provider``)."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...
    async def aclose(self) -> None: ...


class OtherAgent(Protocol):
    """What a tool needs of the agent it stands for (an ``agent.file.Agent``)."""

    @property
    def name(self) -> str: ...
    @property
    def instructions(self) -> str: ...
    @property
    def tools(self) -> ToolRegistry: ...
    @property
    def toolbox(self) -> Toolbox: ...
    @property
    def provider(self) -> _Model: ...
    async def start(self) -> None: ...
    async def aclose(self) -> None: ...


AgentLoader = Callable[[Path, tuple[Path, ...]], OtherAgent]
"""Loads an agent file, given the files being loaded above it (``agent.file.load_agent``):
passed in, so that ``tools`` never imports ``agent``, the layer above it."""


class AgentTools(EntryBackend):
    """One other agent, offered as one tool named after the entry.

    Args:
        entry: the ``[[agent_tools]]`` settings of the agent file.
        load: loads the other agent's file.
        base_dir: the agent file's directory; a relative ``file`` is in it.
        chain: the agent files being loaded above this one: an agent that names itself,
            directly or through others, is a startup error (it would never finish).
    """

    kind: BackendKind = "agent"

    def __init__(
        self,
        entry: AgentToolEntry,
        load: AgentLoader,
        base_dir: Path,
        chain: tuple[Path, ...] = (),
    ) -> None:
        super().__init__(entry)
        self._entry = entry
        self._load = load
        self._path = (base_dir / entry.file).resolve()
        if self._path in chain:
            raise ConfigError(f"{self.name}: {entry.file} is already being loaded (a cycle)")
        self._chain = chain
        self._agent: OtherAgent | None = None
        self._definition = ToolDef(
            name=entry.name,
            description=entry.description,
            kind="server",
            input_schema=_INPUT_SCHEMA,
            output_schema=_OUTPUT_SCHEMA,
            display_name=entry.display_name or default_display_name(entry.name),
            timeout=entry.timeout,
            execution=entry.execution,
        )

    async def start(self) -> None:
        """Load the other agent's file and start its own tool backends.

        Raises:
            ConfigError: its file is invalid, or one of its backends cannot start.
        """
        agent = self._load(self._path, self._chain)
        await agent.start()
        self._agent = agent

    def definitions(self) -> Sequence[ToolDef]:
        return (self._definition,) if self._agent is not None else ()

    def on_change(self, listener: Callable[[], None]) -> None:
        """One tool, for as long as the gateway runs."""

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,
    ) -> Any:
        """Run the other agent's turn on ``args["request"]``; its final text is the result.

        Raises:
            ToolError: its model failed, or it was still calling tools at its last step.
        """
        agent = self._agent
        if agent is None:
            raise ToolError(f"{self.name} is not started")
        items: list[Item] = [UserTurn(text=str(args["request"]))]
        tools = tuple(
            ToolSchema(name=d.name, description=d.description, input_schema=d.input_schema)
            for d in agent.tools.definitions()
            if d.kind == "server"
        )
        for step in range(1, self._entry.max_steps + 1):
            progress({"agent": agent.name, "step": step})
            request = ModelRequest(instructions=agent.instructions, items=tuple(items), tools=tools)
            text, calls = await self._step(agent, request)
            requested = tuple(
                RequestedCall(call_id=f"call_{secrets.token_urlsafe(9)}", name=c.name, args=c.args)
                for c in calls
            )
            items.append(AssistantTurn(text=text, calls=requested))
            if not requested:
                log.info("agent_tool_answered", agent=agent.name, steps=step, size=len(text))
                return {"text": text}
            for call in requested:
                progress({"agent": agent.name, "step": step, "tool": call.name})
                items.append(await self._run(agent, call, caller))
        raise ToolError(
            f"agent {agent.name!r} was still calling tools after {self._entry.max_steps} steps"
        )

    async def aclose(self) -> None:
        if self._agent is not None:
            agent, self._agent = self._agent, None
            await agent.aclose()
            await agent.provider.aclose()

    @staticmethod
    async def _step(agent: OtherAgent, request: ModelRequest) -> tuple[str, list[ModelToolCall]]:
        """One model step of the other agent: its whole text and its tool calls."""
        text: list[str] = []
        calls: list[ModelToolCall] = []
        try:
            async for event in agent.provider.stream(request):
                if isinstance(event, ModelText):
                    text.append(event.text)
                elif isinstance(event, ModelToolCall):
                    calls.append(event)
                elif isinstance(event, ModelFinish):
                    break
        except ProviderError as exc:
            raise ToolError(f"agent {agent.name!r}: its model failed: {exc}") from exc
        return "".join(text), calls

    @staticmethod
    async def _run(agent: OtherAgent, call: RequestedCall, caller: Caller) -> ToolOutcome:
        """One of the other agent's tool calls, checked as the session checks its own."""
        entry = agent.tools.get(call.name)
        if entry is None or entry.definition.kind != "server":
            return ToolOutcome(call_id=call.call_id, name=call.name, error="unknown tool")
        if problem := entry.input_validator.problem(call.args):
            error = f"invalid arguments: {problem}"
            return ToolOutcome(call_id=call.call_id, name=call.name, error=error)
        try:
            output = await agent.toolbox.call(call.name, call.args, lambda _: None, caller)
        except Exception as exc:  # the tool's failure is the other agent's to hear about
            return ToolOutcome(call_id=call.call_id, name=call.name, error=tool_failure(exc))
        return ToolOutcome(call_id=call.call_id, name=call.name, output=msgspec.to_builtins(output))

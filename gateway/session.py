"""The session core: a pure state machine, events in, effects out.

It never awaits, reads a clock or touches a socket. The driver feeds it events
(client messages, model output, tool outcomes, ticks) with the current time and
executes the effects it returns (send a message, call the model, run a tool).
Bad peer input never raises out of ``receive``: it becomes an ``error`` event.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.call import Call, CallState
from gateway.errors import ConfigError
from gateway.protocol import (
    PROTOCOL_VERSION,
    ClientCall,
    DecodeFailure,
    Error,
    Inbound,
    Limits,
    Ping,
    Pong,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    ResponseStatus,
    ServerMsg,
    SessionCreated,
    SessionStart,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolInfo,
    ToolResult,
    ToolResults,
    ToolStatus,
    Usage,
    UserMessage,
)
from gateway.providers.base import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    ToolSchema,
)
from gateway.tools import ToolDef, ToolRegistry, default_display_name
from gateway.transcript import AssistantTurn, Item, RequestedCall, ToolOutcome, UserTurn

__all__ = [
    "CallModel",
    "CancelModel",
    "CancelTool",
    "Disconnected",
    "Effect",
    "Event",
    "ModelFailed",
    "ModelOutput",
    "RunTool",
    "Send",
    "Session",
    "SessionSettings",
    "Tick",
    "ToolFinished",
]

# --------------------------------------------------------------------- events


class Tick(msgspec.Struct, frozen=True):
    """Time passed; the session expires what is due."""


class ModelOutput(msgspec.Struct, frozen=True):
    """An event of the model stream started by ``CallModel(step_id)``."""

    step_id: str
    event: ModelEvent


class ModelFailed(msgspec.Struct, frozen=True):
    """The model stream of ``step_id`` broke."""

    step_id: str
    message: str
    retryable: bool = True


class ToolFinished(msgspec.Struct, frozen=True, kw_only=True):
    """A server tool returned (``output``) or raised (``error``)."""

    call_id: str
    output: Any = None
    error: str | None = None


class Disconnected(msgspec.Struct, frozen=True):
    """The client's socket is gone; the session stops all its work."""


Event = Inbound | DecodeFailure | Tick | ModelOutput | ModelFailed | ToolFinished | Disconnected

# --------------------------------------------------------------------- effects


class Send(msgspec.Struct, frozen=True):
    msg: ServerMsg


class CallModel(msgspec.Struct, frozen=True):
    step_id: str
    response_id: str
    request: ModelRequest


class CancelModel(msgspec.Struct, frozen=True):
    step_id: str


class RunTool(msgspec.Struct, frozen=True, kw_only=True):
    call_id: str
    tool: str
    args: dict[str, Any]
    response_id: str


class CancelTool(msgspec.Struct, frozen=True):
    call_id: str


Effect = Send | CallModel | CancelModel | RunTool | CancelTool


@dataclass(frozen=True, kw_only=True)
class SessionSettings:
    """What a session is built from: the agent and the limits in force."""

    agent: str
    instructions: str
    tools: ToolRegistry
    model_supports_tools: bool
    limits: Limits
    server_tool_timeout: float


class Phase(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


@dataclass
class _Response:
    response_id: str
    steps: int = 0
    step_id: str | None = None
    """The model step streaming now, if any."""
    text: list[str] = field(default_factory=list)
    requested: list[ModelToolCall] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    """Calls of the latest step; the next step starts when all are settled."""
    usage: Usage = field(default_factory=Usage)


class Session:
    """One conversation's protocol state. See the module docstring."""

    def __init__(
        self, settings: SessionSettings, *, session_id: str, new_id: Callable[[str], str]
    ) -> None:
        self.session_id = session_id
        self._settings = settings
        self._tools = settings.tools
        self._instructions = settings.instructions
        self._new_id = new_id
        self._phase = Phase.NEW
        self._seq = 0
        self._effects: list[Effect] = []
        self._items: list[Item] = []
        self._calls: dict[str, Call] = {}
        self._queue: deque[UserMessage] = deque()
        self._response: _Response | None = None
        self._now = 0.0
        self.metadata: dict[str, Any] = {}
        """What the client sent in ``session.start``; the gateway keeps it for the app."""

    # ----------------------------------------------------------------- public

    @property
    def closed(self) -> bool:
        return self._phase is Phase.CLOSED

    def receive(self, event: Event, *, now: float) -> None:
        """Apply one event. Effects accumulate until ``effects()`` is called."""
        self._now = now
        if self._phase is Phase.CLOSED:
            return
        match event:
            case DecodeFailure(code=code, message=message, in_reply_to=in_reply_to):
                self._error(code, message, in_reply_to=in_reply_to)
            case Ping(ts=ts):
                self._send(Pong(ts=ts))
            case SessionStart():
                self._start_session(event)
            case Disconnected():
                self._shut_down()
            case _ if self._phase is Phase.NEW and not isinstance(event, Tick):
                self._error(
                    "invalid_message", "send session.start first", in_reply_to=_id_of(event)
                )
            case UserMessage():
                self._accept_user_message(event)
            case ToolResults():
                for result in event.results:
                    self._accept_client_result(result, event.id)
                self._advance_if_step_settled()
            case ResponseCancel(response_id=response_id):
                self._cancel_response(response_id)
            case ModelOutput(step_id=step_id, event=model_event):
                self._on_model_event(step_id, model_event)
            case ModelFailed():
                self._on_model_failed(event)
            case ToolFinished():
                self._on_tool_finished(event)
            case Tick():
                self._expire_due_calls()

    def effects(self) -> list[Effect]:
        """Take the effects produced since the last call, in order."""
        effects, self._effects = self._effects, []
        return effects

    def next_deadline(self) -> float | None:
        """When the session next needs a ``Tick``, or ``None``."""
        deadlines = [call.deadline for call in self._open_calls()]
        return min(deadlines, default=None)

    # ----------------------------------------------------------------- session

    def _start_session(self, msg: SessionStart) -> None:
        if self._phase is not Phase.NEW:
            self._error("invalid_message", "the session has already started", in_reply_to=msg.id)
            return
        if msg.agent is not None and msg.agent != self._settings.agent:
            self._error("invalid_message", f"unknown agent {msg.agent[:64]!r}", in_reply_to=msg.id)
            return
        client_defs = [
            ToolDef(
                name=spec.name,
                description=spec.description,
                kind="client",
                input_schema=spec.input_schema,
                output_schema=spec.output_schema,
                display_name=spec.display_name or default_display_name(spec.name),
                timeout=spec.timeout,
            )
            for spec in msg.client_functions
        ]
        try:
            tools = self._tools.extended(client_defs)
        except ConfigError as exc:
            self._error("invalid_message", f"client_functions: {exc}", in_reply_to=msg.id)
            return
        if len(tools) and not self._settings.model_supports_tools:
            self._error(
                "invalid_message", "this agent's model cannot call tools", in_reply_to=msg.id
            )
            return
        self._tools = tools
        if msg.instructions:
            self._instructions = f"{self._instructions}\n\n{msg.instructions}".strip()
        self._phase = Phase.OPEN
        self.metadata = msg.metadata
        infos = [
            ToolInfo(
                name=d.name,
                kind=d.kind,
                execution=d.execution,
                display_name=d.display_name or default_display_name(d.name),
                description=d.description,
            )
            for d in tools.definitions()
        ]
        self._send(
            SessionCreated(
                session_id=self.session_id,
                protocol_version=PROTOCOL_VERSION,
                agent=self._settings.agent,
                tools=infos,
                limits=self._settings.limits,
            )
        )

    def _shut_down(self) -> None:
        response = self._response
        if response is not None and response.step_id is not None:
            self._effects.append(CancelModel(response.step_id))
        for call in self._open_calls():
            if call.kind == "server":
                self._effects.append(CancelTool(call.call_id))
            call.advance(CallState.CANCELLED)
        self._response = None
        self._queue.clear()
        self._phase = Phase.CLOSED

    # ----------------------------------------------------------------- turns

    def _accept_user_message(self, msg: UserMessage) -> None:
        limit = self._settings.limits.max_message_chars
        if len(msg.text) > limit:
            self._error(
                "message_too_large",
                f"text has {len(msg.text)} characters; the limit is {limit}",
                in_reply_to=msg.id,
            )
        elif not msg.text.strip():
            self._error("invalid_message", "text must not be blank", in_reply_to=msg.id)
        elif self._response is None:
            self._start_response(msg)
        elif len(self._queue) >= self._settings.limits.max_queued_messages:
            self._error(
                "busy",
                "too many messages waiting for the running response",
                in_reply_to=msg.id,
                retryable=True,
            )
        else:
            self._queue.append(msg)

    def _start_response(self, msg: UserMessage) -> None:
        self._items.append(UserTurn(text=msg.text))
        self._response = _Response(response_id=self._new_id("resp"))
        self._send(ResponseCreated(response_id=self._response.response_id, in_reply_to=msg.id))
        self._start_step(self._response)

    def _start_step(self, response: _Response) -> None:
        response.steps += 1
        response.step_id = self._new_id("step")
        response.text = []
        response.requested = []
        request = ModelRequest(
            instructions=self._instructions,
            items=tuple(self._items),
            tools=tuple(
                ToolSchema(name=d.name, description=d.description, input_schema=d.input_schema)
                for d in self._tools.definitions()
            ),
        )
        self._effects.append(CallModel(response.step_id, response.response_id, request))

    def _end_response(self, status: ResponseStatus) -> None:
        response = self._response
        assert response is not None
        self._send(
            ResponseDone(
                response_id=response.response_id,
                status=status,
                turn_completed=status == "completed",
                usage=response.usage,
            )
        )
        self._response = None
        if self._queue:
            self._start_response(self._queue.popleft())

    def _cancel_response(self, response_id: str | None) -> None:
        response = self._response
        # A cancel racing the end of its response is not an error: nothing to stop.
        if response is None or response_id not in (None, response.response_id):
            return
        if response.step_id is not None:
            self._effects.append(CancelModel(response.step_id))
            if response.text:
                self._items.append(AssistantTurn(text="".join(response.text)))
            response.step_id = None
        for call in response.calls:
            if not call.settled:
                if call.kind == "server":
                    self._effects.append(CancelTool(call.call_id))
                self._settle(call, CallState.CANCELLED, error="cancelled by the user")
        self._record_outcomes(response)
        self._end_response("cancelled")

    # ----------------------------------------------------------------- model

    def _on_model_event(self, step_id: str, event: ModelEvent) -> None:
        response = self._response
        if response is None or response.step_id != step_id:
            return  # output of a cancelled step: dropped, never sent
        match event:
            case ModelText(text=text) if text:
                response.text.append(text)
                self._send(TextDelta(response_id=response.response_id, delta=text))
            case ModelToolCall():
                response.requested.append(event)
            case ModelFinish(usage=usage):
                if usage is not None:
                    response.usage.input_tokens += usage.input_tokens
                    response.usage.output_tokens += usage.output_tokens
                self._finish_step(response)

    def _on_model_failed(self, event: ModelFailed) -> None:
        response = self._response
        if response is None or response.step_id != event.step_id:
            return
        if response.text:
            self._items.append(AssistantTurn(text="".join(response.text)))
        response.step_id = None
        self._error(
            "provider_error",
            event.message,
            retryable=event.retryable,
            response_id=response.response_id,
        )
        self._end_response("failed")

    def _finish_step(self, response: _Response) -> None:
        text = "".join(response.text)
        response.step_id = None
        if response.requested and response.steps >= self._settings.limits.max_steps:
            # No step is left to use their results, so the calls are not run at all.
            self._items.append(AssistantTurn(text=text))
            if text:
                self._send(TextDone(response_id=response.response_id, text=text))
            self._error(
                "max_steps_exceeded",
                f"the model asked for tools after its last allowed step ({response.steps})",
                response_id=response.response_id,
            )
            self._end_response("incomplete")
            return
        response.calls = [self._new_call(response, request) for request in response.requested]
        self._items.append(
            AssistantTurn(
                text=text,
                calls=tuple(
                    RequestedCall(call_id=c.call_id, name=c.tool, args=c.args)
                    for c in response.calls
                ),
            )
        )
        if text:
            self._send(TextDone(response_id=response.response_id, text=text))
        if not response.calls:
            self._end_response("completed")
            return
        batch = [client_call for call in response.calls if (client_call := self._dispatch(call))]
        if batch:
            self._send(ToolCalls(response_id=response.response_id, calls=batch))
        self._advance_if_step_settled()

    # ----------------------------------------------------------------- tool calls

    def _new_call(self, response: _Response, request: ModelToolCall) -> Call:
        entry = self._tools.get(request.name)
        definition = entry.definition if entry else None
        default_timeout = (
            self._settings.limits.client_call_timeout
            if definition is None or definition.kind == "client"
            else self._settings.server_tool_timeout
        )
        timeout = (definition.timeout if definition else None) or default_timeout
        call = Call(
            call_id=self._new_id("call"),
            tool=request.name,
            display_name=(definition.display_name if definition else "")
            or default_display_name(request.name),
            kind=definition.kind if definition else "server",
            args=request.args,
            response_id=response.response_id,
            deadline=self._now + timeout,
        )
        self._calls[call.call_id] = call
        return call

    def _dispatch(self, call: Call) -> ClientCall | None:
        """Start a call; return it when it must go to the client in the batch."""
        entry = self._tools.get(call.tool)
        if entry is None:
            self._settle(call, CallState.FAILED, error=f"unknown tool {call.tool!r}")
            return None
        problem = entry.input_validator.problem(call.args)
        if problem:
            self._settle(call, CallState.FAILED, error=f"invalid arguments: {problem}")
            return None
        if call.kind == "client":
            return ClientCall(
                call_id=call.call_id,
                tool=call.tool,
                display_name=call.display_name,
                args=call.args,
                deadline=call.deadline,
                timeout=round(call.deadline - self._now, 3),
            )
        call.advance(CallState.RUNNING)
        self._send(_status(call))
        self._effects.append(
            RunTool(
                call_id=call.call_id, tool=call.tool, args=call.args, response_id=call.response_id
            )
        )
        return None

    def _accept_client_result(self, result: ToolResult, msg_id: str | None) -> None:
        call = self._calls.get(result.call_id)
        if call is None or call.kind != "client":
            self._error(
                "unknown_call",
                "no client-function call with this id in this session",
                in_reply_to=msg_id,
                call_id=result.call_id[:128],
            )
            return
        mismatch = _echo_mismatch(result, call)
        if mismatch:
            self._error("invalid_result", mismatch, in_reply_to=msg_id, call_id=call.call_id)
            return
        if call.settled:
            self._send(_status(call, duplicate=True))
            return
        has_output = result.output is not msgspec.UNSET
        if has_output == isinstance(result.error, str):
            self._error(
                "invalid_result",
                "a result carries exactly one of 'output' or 'error'",
                in_reply_to=msg_id,
                call_id=call.call_id,
            )
            return
        if isinstance(result.error, str):
            self._settle(call, CallState.FAILED, error=result.error)
            return
        problem = self._output_problem(call, result.output)
        if problem:
            self._error("invalid_result", problem, in_reply_to=msg_id, call_id=call.call_id)
            self._settle(call, CallState.FAILED, error=problem)
        else:
            self._settle(call, CallState.COMPLETED, output=result.output)

    def _on_tool_finished(self, event: ToolFinished) -> None:
        call = self._calls.get(event.call_id)
        if call is None or call.settled:
            return  # finished after a cancel or a timeout: already settled
        if event.error is not None:
            self._settle(call, CallState.FAILED, error=event.error)
        elif problem := self._output_problem(call, event.output):
            self._settle(call, CallState.FAILED, error=problem)
        else:
            self._settle(call, CallState.COMPLETED, output=event.output)
        self._advance_if_step_settled()

    def _expire_due_calls(self) -> None:
        for call in self._open_calls():
            if call.deadline > self._now:
                continue
            if call.kind == "client":
                self._settle(call, CallState.EXPIRED, error="the client did not answer in time")
            else:
                self._effects.append(CancelTool(call.call_id))
                self._settle(
                    call, CallState.FAILED, error="tool_timeout: the tool did not finish in time"
                )
        self._advance_if_step_settled()

    def _output_problem(self, call: Call, output: Any) -> str | None:
        entry = self._tools.get(call.tool)
        if entry is None or entry.output_validator is None:
            return None
        problem = entry.output_validator.problem(output)
        return f"result does not match the output schema: {problem}" if problem else None

    def _settle(
        self, call: Call, state: CallState, *, output: Any = None, error: str | None = None
    ) -> None:
        call.advance(state)
        call.output, call.error = output, error
        self._send(_status(call))

    def _advance_if_step_settled(self) -> None:
        response = self._response
        if response is None or response.step_id is not None or not response.calls:
            return
        if all(call.settled for call in response.calls):
            self._record_outcomes(response)
            self._start_step(response)

    def _record_outcomes(self, response: _Response) -> None:
        for call in response.calls:
            self._items.append(
                ToolOutcome(
                    call_id=call.call_id, name=call.tool, output=call.output, error=call.error
                )
            )
        response.calls = []

    def _open_calls(self) -> list[Call]:
        response = self._response
        return [c for c in response.calls if not c.settled] if response else []

    # ----------------------------------------------------------------- output

    def _send(self, msg: ServerMsg) -> None:
        self._seq += 1
        msg.seq = self._seq
        self._effects.append(Send(msg))

    def _error(
        self,
        code: str,
        message: str,
        *,
        in_reply_to: str | None = None,
        call_id: str | None = None,
        response_id: str | None = None,
        retryable: bool = False,
    ) -> None:
        self._send(
            Error(
                code=code,
                message=message,
                in_reply_to=in_reply_to,
                call_id=call_id,
                response_id=response_id,
                retryable=retryable,
            )
        )


def _status(call: Call, *, duplicate: bool = False) -> ToolStatus:
    status = ToolStatus(
        call_id=call.call_id,
        tool=call.tool,
        status=call.state.value,
        response_id=call.response_id,
        error=call.error,
        duplicate=duplicate,
    )
    if call.kind == "server" and call.state is CallState.COMPLETED:
        status.result = call.output
    return status


def _echo_mismatch(result: ToolResult, call: Call) -> str | None:
    """Say how a result's echo of ``tool``/``display_name`` differs from its call."""
    if result.tool != call.tool:
        return f"result names tool {result.tool[:64]!r} but call {call.call_id} is {call.tool!r}"
    if result.display_name is not None and result.display_name != call.display_name:
        return (
            f"result names display_name {result.display_name[:64]!r} but call {call.call_id}"
            f" has {call.display_name!r}"
        )
    return None


def _id_of(event: Event) -> str | None:
    return getattr(event, "id", None)

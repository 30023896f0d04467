"""The session core: a pure state machine, events in, effects out.

It never awaits, reads a clock or touches a socket. The driver feeds it events
(client messages, model output, tool outcomes, ticks) with the current time and
executes the effects it returns (send a message, call the model, run a tool).
Bad peer input never raises out of ``receive``: it becomes an ``error`` event.

This module owns sessions and responses (turns, model steps, cancellation,
delivery of async results); ``dispatch`` owns the tool calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.call import CallState, Ledger
from gateway.confirm import ConfirmRule
from gateway.dispatch import Completion, Dispatcher
from gateway.errors import ConfigError
from gateway.event import (
    CallModel,
    CancelModel,
    Disconnected,
    Effect,
    Event,
    ModelFailed,
    ModelOutput,
    ShuttingDown,
    Tick,
    ToolFinished,
    ToolProgress,
)
from gateway.history import History, Mark
from gateway.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelRetrying,
    ModelText,
    ModelToolCall,
    ToolSchema,
)
from gateway.outbox import Outbox
from gateway.principal import ANONYMOUS, Principal
from gateway.protocol import (
    PROTOCOL_VERSION,
    Ack,
    AgentTransferred,
    ClientCall,
    ConfirmItem,
    DecodeFailure,
    Error,
    Limits,
    Ping,
    Pong,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    ResponseRetrying,
    ResponseStatus,
    ResponseTruncate,
    ResponseTruncated,
    ServerMsg,
    SessionCreated,
    SessionEnded,
    SessionResume,
    SessionSnapshot,
    SessionStart,
    SessionUpdate,
    SessionUpdated,
    TextDelta,
    TextDone,
    TextSegment,
    ToolConfirmation,
    ToolInfo,
    ToolResults,
    ToolRun,
    ToolSpec,
    TranscriptEntry,
    UserMessage,
)
from gateway.schema_guard import SchemaGuard
from gateway.segments import DEFAULT_FIRST_MIN_CHARS, Segmenter
from gateway.state import PendingNote, Phase, ResponseState, SessionState
from gateway.tool_choice import (
    choice_problem,
    narrowing_problem,
    refusal,
    step_choice,
    steps_problem,
)
from gateway.tools import ToolDef, ToolRegistry, default_display_name
from gateway.transcript import (
    CANCELLED,
    AssistantTurn,
    ContextNote,
    Item,
    RequestedCall,
    UserTurn,
)

__all__ = ["AgentProfile", "Session", "SessionSettings"]

_REMEMBERED_MESSAGE_IDS = 1_000


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
    """The model honours ``tool_choice`` (``gateway.tool_choice``)."""
    confirm_rules: Mapping[str, ConfirmRule] = dataclasses.field(default_factory=dict)
    """The rules tools name in ``confirm_rule`` (``gateway.confirm``), by reference."""
    agents: Callable[[str], AgentProfile | None] = lambda _: None
    """The agents a session may be handed to, by name (their tools as they are now)."""

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


class Session:
    """One conversation's protocol state. See the module docstring."""

    def __init__(
        self,
        settings: SessionSettings,
        *,
        session_id: str,
        resume_token: str,
        new_id: Callable[[str], str],
    ) -> None:
        self.session_id = session_id
        self._resume_token = resume_token
        self.metadata: dict[str, Any] = {}
        """What the client sent in ``session.start``; kept for the application."""
        self._settings = settings
        self._instructions = settings.instructions
        self._client_instructions: str | None = None
        """What the client added to the agent's instructions (kept across transfers)."""
        self._new_id = new_id
        self._phase = Phase.NEW
        self._out = Outbox()
        self._calls = Dispatcher(
            self._out,
            tools=settings.tools,
            new_id=new_id,
            client_call_timeout=settings.limits.client_call_timeout,
            server_tool_timeout=settings.server_tool_timeout,
            max_result_size=settings.limits.max_tool_result_size,
            principal=settings.principal,
            confirm_rules=settings.confirm_rules,
        )
        self._calls.agent = settings.agent
        self._history = History(settings.max_history_chars)
        self._notes: list[PendingNote] = []
        self._queue: list[UserMessage] = []  # a few (max_queued_messages); a deque is 760 B
        self._message_ids: dict[str, None] = {}
        """Ids of recent user messages, oldest first (a dict keeps insertion order)."""
        self._response: ResponseState | None = None
        self._client_specs: list[ToolSpec] = []
        """The client's own functions, as accepted (kept in the state)."""
        self._tool_choice = "auto"
        """The session's default ``tool_choice`` (``session.start``/``session.update``)."""
        self._max_steps: int | None = None
        """The session's default ``max_steps``; ``None``: the gateway's limit."""
        self._tool_mode = "auto"
        """The session's default tool mode: ``manual`` sends every tool call to the client."""
        self.time_zone: str | None = None
        """The user's time zone, from ``session.start`` (for tools that tell the time)."""
        self._ending: str | None = None
        """Why the agent ends the session (its ``end_session`` tool completed): it ends
        once the running response is done."""
        self._latest: str | None = None
        """The id of the latest response, the only one ``response.truncate`` may cut."""
        self._segments = False
        """Voice: the answers' text goes out in ``text.segment`` events too."""
        self._segmenter: Segmenter | None = None
        """Cuts the running response's text into segments; made again after a restore
        (``_segmenter_for``)."""
        self._now = 0.0

    @classmethod
    def restore(
        cls, settings: SessionSettings, state: SessionState, *, new_id: Callable[[str], str]
    ) -> Session:
        """Carry on a session from its ``state()``, in this process or another.

        The session belongs to the principal the state names (``settings.principal`` is
        replaced by it); the agent's tools and the limits come from ``settings`` (from
        ``settings.agents`` when the session was handed to another agent).

        Raises:
            ConfigError: the state's client functions do not pass this gateway's schema
                limits (they changed since the session declared them), or its agent is not
                one this gateway has.
        """
        settings = dataclasses.replace(settings, principal=state.principal)
        if state.agent is not None and state.agent != settings.agent:
            profile = settings.agents(state.agent)
            if profile is None:
                raise ConfigError(f"agent {state.agent!r}: not one this gateway has")
            settings = settings.switched(profile)
        session = cls(settings, session_id=state.session_id, resume_token="", new_id=new_id)
        session._phase = state.phase
        session._instructions = state.instructions
        session._client_instructions = state.client_instructions
        session.metadata = state.metadata
        session._client_specs = state.client_functions
        session._tool_choice, session._max_steps = state.tool_choice, state.max_steps
        session._tool_mode = state.tool_mode
        session.time_zone = state.time_zone
        session._ending = state.ending
        session._latest = state.latest_response
        session._segments = state.segments
        session._calls.tools = session._registry(state.client_functions)
        session._calls.ledger = Ledger.restore(state.calls)
        session._out.seq = state.seq
        session._history = History.restore(
            settings.max_history_chars, state.history, state.turn_starts
        )
        session._notes = list(state.notes)
        session._queue = list(state.queue)
        session._message_ids = dict.fromkeys(state.message_ids)
        response = state.response
        if response is not None:
            # The response's calls are the ledger's: one object per call, as before.
            ledger = session._calls.ledger
            response.calls = [ledger.get(call.call_id) or call for call in response.calls]
        session._response = response
        return session

    def state(self, *, with_history: bool = True) -> SessionState:
        """Everything this session is, as one value (it shares this session's objects:
        encode it before the next ``receive``). Without history, its transcript is left
        out (a store that keeps it apart, see ``history_since``)."""
        return SessionState(
            session_id=self.session_id,
            phase=self._phase,
            principal=self._settings.principal,
            instructions=self._instructions,
            client_instructions=self._client_instructions,
            agent=self._settings.agent,
            client_functions=self._client_specs,
            metadata=self.metadata,
            seq=self._out.seq,
            history=list(self._history.items) if with_history else [],
            turn_starts=self._history.turn_starts,
            notes=list(self._notes),
            queue=list(self._queue),
            message_ids=list(self._message_ids),
            response=self._response,
            calls=self._calls.ledger.calls(),
            tool_choice=self._tool_choice,
            max_steps=self._max_steps,
            tool_mode=self._tool_mode,
            time_zone=self.time_zone,
            ending=self._ending,
            latest_response=self._latest,
            segments=self._segments,
        )

    # ----------------------------------------------------------------- public

    @property
    def closed(self) -> bool:
        return self._phase is Phase.CLOSED

    @property
    def ended_by_agent(self) -> bool:
        """The session is over because the agent ended it (``session.ended`` was sent)."""
        return self._phase is Phase.CLOSED and self._ending is not None

    @property
    def agent(self) -> str:
        """The agent the session is with (another after ``transfer_to_agent``)."""
        return self._settings.agent

    @property
    def principal(self) -> Principal:
        """Who the session belongs to, with the end user's claims (for tools)."""
        return self._settings.principal

    def model_text(self, step_id: str, text: str, *, now: float) -> None:
        """``receive(ModelOutput(step_id, ModelText(text)), now=now)``, for the event
        that comes most by far (every delta of every answer), without building the event
        and matching it to find what it is."""
        self._now = now
        if self._phase is not Phase.CLOSED:
            response = self._response
            if response is not None and response.step_id == step_id and text:
                self._on_text(response, text)

    def receive(self, event: Event, *, now: float) -> None:
        """Apply one event. Effects accumulate until ``effects()`` is called."""
        self._now = now
        if self._phase is Phase.CLOSED:
            return
        match event:
            case ModelOutput(step_id=step_id, event=model_event):  # the most frequent first
                self._on_model_event(step_id, model_event)
            case DecodeFailure(code=code, message=message, in_reply_to=in_reply_to):
                self._out.error(code, message, in_reply_to=in_reply_to, retryable=event.retryable)
            case Ping(ts=ts):
                self._out.send(Pong(ts=ts))
            case SessionStart():
                self._start_session(event)
            case SessionResume():
                self._out.error(
                    "invalid_message",
                    "session.resume must be the first message on a new socket",
                    in_reply_to=event.id,
                )
            case Disconnected():
                self._shut_down()
            case ShuttingDown():
                if self._response is not None:
                    self._cancel_response(
                        None,
                        status="incomplete",
                        reason="cancelled: the gateway is restarting",
                        start_next=False,
                    )
                self._queue.clear()
            case _ if self._phase is Phase.NEW and not isinstance(event, Tick):
                self._out.error(
                    "invalid_message", "send session.start first", in_reply_to=_id_of(event)
                )
            case Ack():
                pass  # the driver trims the event log; nothing changes in the session
            case SessionUpdate():
                self._update_session(event)
            case UserMessage():
                self._accept_user_message(event)
            case ToolResults():
                for result in event.results:
                    self._calls.accept_client_result(result, event.id)
                    self._note_ending(result.call_id)
                self._advance_if_step_settled()
            case ToolRun():
                self._calls.run_on_gateway(event, self._now)
                self._advance_if_step_settled()
            case ToolConfirmation():
                self._calls.confirmation(event, self._now)
                self._advance_if_step_settled()
            case ResponseCancel(response_id=response_id):
                self._cancel_response(response_id)
            case ResponseTruncate():
                self._truncate(event)
            case ModelFailed():
                self._on_model_failed(event)
            case ToolFinished():
                event, transferred = self._hand_over_if_asked(event)
                completion = self._calls.tool_finished(event)
                if transferred is not None:
                    self._out.send(transferred)
                self._note_ending(event.call_id)
                if completion is not None:
                    self._deliver(completion)
                self._advance_if_step_settled()
            case ToolProgress():
                self._calls.tool_progress(event)
            case Tick():
                for completion in self._calls.expire_due(now):
                    self._deliver(completion)
                self._advance_if_step_settled()

    @property
    def history_mark(self) -> Mark:
        """Where the transcript stands now (see ``History.mark``)."""
        return self._history.mark

    def history_since(self, mark: Mark) -> tuple[int, list[Item]]:
        """How the transcript changed after ``mark``: items dropped from its front, and
        items appended (see ``History.since``)."""
        return self._history.since(mark)

    def catch_up(self, sent: Sequence[ServerMsg]) -> bool:
        """Apply what this session sent after its state was last saved (a store saves the
        state at every durable point but those that only add to the log, see
        ``LOG_ONLY``): text deltas of the step streaming then, pongs and errors about
        unreadable frames, which change nothing but ``seq``.

        Returns:
            ``False`` at the first event that is none of these, or out of order (the
            state stays as far as it got).
        """
        response = self._response
        streaming = response is not None and response.step_id is not None
        if streaming and sent:
            assert response is not None
            # What the client had then, as one text: the rest is appended to it.
            response.text, response.unconfirmed = [_seen_text(response)], ""
        for msg in sent:
            if msg.seq != self._out.seq + 1:
                return False
            if isinstance(msg, TextDelta) and streaming:
                assert response is not None
                if msg.response_id != response.response_id:
                    return False
                response.text.append(msg.delta)
            elif not (isinstance(msg, Pong) or (isinstance(msg, Error) and _about_a_frame(msg))):
                return False
            self._out.seq = msg.seq
        return True

    def adopt(self, now: float) -> None:
        """Carry on after the node that drove this session stopped (its state was
        restored here). The model step that node was streaming is lost: it runs again,
        and the text the client already has is not sent twice (when the new attempt
        says something else, the response ends ``incomplete`` with
        ``response_interrupted``). Calls keep their state: a server tool that was
        running elsewhere settles when its outcome is routed here, or at its deadline.
        """
        self._now = now
        self._calls.adopt()
        response = self._response
        if self._phase is not Phase.OPEN or response is None or response.step_id is None:
            return
        self._out.do(CancelModel(response.step_id))  # in case it still runs here
        self._segmenter = None  # made again from what the client has
        response.unconfirmed = _seen_text(response)
        self._start_step(response, again=True)

    def effects(self) -> list[Effect]:
        """Take the effects produced since the last call, in order."""
        return self._out.take()

    def next_deadline(self) -> float | None:
        """When the session next needs a ``Tick``, or ``None``."""
        return self._calls.ledger.next_deadline()

    @property
    def started(self) -> bool:
        return self._phase is not Phase.NEW

    @property
    def responding(self) -> bool:
        """True while a response runs (or user messages wait for one)."""
        return self._response is not None or bool(self._queue)

    @property
    def last_seq(self) -> int:
        return self._out.seq

    @property
    def history_size(self) -> int:
        """The size of the transcript kept, as ``max_history_chars`` measures it."""
        return self._history.size

    def open_client_calls(self, now: float) -> list[ClientCall]:
        """Client-function calls waiting for a result (offered again on resume)."""
        return self._calls.open_client_calls(now)

    def open_confirmations(self, now: float) -> list[ConfirmItem]:
        """Calls waiting for the user's approval (asked again on resume)."""
        return self._calls.open_confirmations(now)

    def snapshot(self, now: float) -> SessionSnapshot:
        """What a client that lost events rebuilds from: the transcript and open calls."""
        transcript = [
            TranscriptEntry(
                role="user" if isinstance(item, UserTurn) else "assistant", text=item.text
            )
            for item in self._history.items
            if isinstance(item, UserTurn) or (isinstance(item, AssistantTurn) and item.text)
        ]
        return SessionSnapshot(
            session_id=self.session_id,
            last_seq=self._out.seq,
            agent=self._settings.agent,
            transcript=transcript,
            open_calls=self.open_client_calls(now),
            open_confirmations=self.open_confirmations(now),
        )

    # ----------------------------------------------------------------- session

    def _start_session(self, msg: SessionStart) -> None:
        if self._phase is not Phase.NEW:
            self._out.error(
                "invalid_message", "the session has already started", in_reply_to=msg.id
            )
            return
        if msg.agent is not None and msg.agent != self._settings.agent:
            self._out.error(
                "invalid_message", f"unknown agent {msg.agent[:64]!r}", in_reply_to=msg.id
            )
            return
        accepted = self._tools_with(msg.client_functions, msg.id)
        if accepted is None:
            return
        if not self._choice_fits(accepted[0], msg.tool_choice, msg.max_steps, None, msg.id):
            return
        self._calls.tools, self._client_specs = accepted
        self._tool_choice = msg.tool_choice or "auto"
        self._max_steps = msg.max_steps
        self._tool_mode = msg.tool_mode or "auto"
        self._segments = bool(msg.segments)
        self.time_zone = msg.time_zone
        tools = self._calls.tools
        if msg.instructions:
            self._client_instructions = msg.instructions
            self._instructions = _joined(self._settings.instructions, msg.instructions)
        self._phase = Phase.OPEN
        self.metadata = msg.metadata
        self._out.send(
            SessionCreated(
                session_id=self.session_id,
                resume_token=self._resume_token,
                protocol_version=PROTOCOL_VERSION,
                agent=self._settings.agent,
                tools=_tool_infos(tools),
                limits=self._settings.limits,
            )
        )

    def _update_session(self, msg: SessionUpdate) -> None:
        """Replace the client's own functions, extra instructions, default ``tool_choice``
        or ``max_steps`` mid-session (all of them, or none after an error)."""
        accepted = (self._calls.tools, self._client_specs)
        if msg.client_functions is not None:
            changed = self._tools_with(msg.client_functions, msg.id)
            if changed is None:
                return
            accepted = changed
        choice = msg.tool_choice or self._tool_choice
        if not self._choice_fits(accepted[0], choice, msg.max_steps, None, msg.id):
            return
        self._calls.tools, self._client_specs = accepted
        self._tool_choice = choice
        if msg.max_steps is not None:
            self._max_steps = msg.max_steps
        if msg.tool_mode is not None:
            self._tool_mode = msg.tool_mode
        if msg.segments is not None:
            self._segments = msg.segments
        if msg.instructions is not None:
            self._client_instructions = msg.instructions
            self._instructions = _joined(self._settings.instructions, msg.instructions)
        self._out.send(SessionUpdated(tools=_tool_infos(self._calls.tools), in_reply_to=msg.id))

    def _choice_fits(
        self,
        tools: ToolRegistry,
        choice: str | None,
        max_steps: int | None,
        narrowed: list[str] | None,
        msg_id: str | None,
    ) -> bool:
        """Whether a ``tool_choice``, ``max_steps`` and ``tools`` narrowing asked for can
        be honoured with ``tools``; if not, the client gets an ``error`` saying why."""
        if choice in (None, "auto", "none") and max_steps is None and narrowed is None:
            return True  # most messages ask for nothing: no list of every tool to build
        names = [d.name for d in tools.definitions()]
        offered = names if narrowed is None else [n for n in names if n in narrowed]
        problem = (
            narrowing_problem(narrowed, names)
            or choice_problem(
                choice,
                offered,
                supports_tools=self._settings.model_supports_tools,
                supports_choice=self._settings.model_supports_tool_choice,
            )
            or steps_problem(max_steps, self._settings.limits.max_steps)
        )
        if problem is not None:
            self._out.error("invalid_message", problem, in_reply_to=msg_id)
        return problem is None

    def _tools_with(
        self, specs: list[ToolSpec], msg_id: str | None
    ) -> tuple[ToolRegistry, list[ToolSpec]] | None:
        """The agent's tools plus the client's functions, and the client's own functions
        among ``specs``; ``None`` after an error.

        A client may declare a function the agent already declares as a client
        function: it says it implements it, and the agent's declaration stands.
        """
        if not self._allowed(self._own(specs), msg_id):
            return None
        try:
            tools = self._registry(specs)
        except ConfigError as exc:
            self._out.error("invalid_message", f"client_functions: {exc}", in_reply_to=msg_id)
            return None
        if len(tools) and not self._settings.model_supports_tools:
            self._out.error(
                "invalid_message", "this agent's model cannot call tools", in_reply_to=msg_id
            )
            return None
        return tools, specs

    def _registry(self, specs: list[ToolSpec]) -> ToolRegistry:
        """The agent's tools plus the client's own functions among ``specs`` (kept whole:
        after a transfer, another agent may not declare the same client functions).

        Raises:
            ConfigError: a client function is invalid (its name, its schemas).
        """
        allowed = self._settings.principal.client_functions
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
            for spec in self._own(specs)
            if allowed is None or spec.name in allowed  # after a transfer: see _allowed
        ]
        return self._settings.tools.extended(client_defs, self._settings.schema_guard)

    def _allowed(self, specs: list[ToolSpec], msg_id: str | None) -> bool:
        """Whether the principal may declare these client functions (the agent's own
        client functions are always allowed: declaring them adds nothing)."""
        allowed = self._settings.principal.client_functions
        denied = sorted({s.name for s in specs} - allowed) if allowed is not None else []
        if denied:
            names = ", ".join(repr(name[:64]) for name in denied[:8])
            self._out.error(
                "forbidden",
                f"client_functions: this client's token does not allow {names}",
                in_reply_to=msg_id,
            )
        return not denied

    def _own(self, specs: list[ToolSpec]) -> list[ToolSpec]:
        """The client's own functions: those the agent does not declare as client functions."""
        agent_tools = self._settings.tools
        return [
            spec
            for spec in specs
            if not ((known := agent_tools.get(spec.name)) and known.definition.kind == "client")
        ]

    def declared_schemas(self, msg: SessionStart | SessionUpdate) -> list[dict[str, Any]]:
        """The schemas ``msg`` declares that the session will check, in the order it checks
        them (so the driver can have them checked off the event loop first)."""
        return [
            schema
            for spec in self._own(msg.client_functions or [])
            for schema in (spec.input_schema, spec.output_schema)
            if schema is not None
        ]

    def _shut_down(self) -> None:
        response = self._response
        if response is not None and response.step_id is not None:
            self._out.do(CancelModel(response.step_id))
        self._calls.drop_all()
        self._response = None
        self._queue.clear()
        self._phase = Phase.CLOSED

    # ----------------------------------------------------------------- responses

    def _accept_user_message(self, msg: UserMessage) -> None:
        limits = self._settings.limits
        # An id makes a user message idempotent: a client that is not sure its message
        # arrived before a drop sends it again, and it counts once. Only accepted
        # messages are remembered, so one refused as busy may be retried as it is.
        if msg.id is not None and msg.id in self._message_ids:
            return
        if len(msg.text) > limits.max_message_chars:
            self._out.error(
                "message_too_large",
                f"text has {len(msg.text)} characters; the limit is {limits.max_message_chars}",
                in_reply_to=msg.id,
            )
        elif not msg.text.strip():
            self._out.error("invalid_message", "text must not be blank", in_reply_to=msg.id)
        elif not self._choice_fits(
            self._calls.tools, msg.tool_choice, msg.max_steps, msg.tools, msg.id
        ):
            pass  # the error is sent
        elif self._response is not None and len(self._queue) >= limits.max_queued_messages:
            self._out.error(
                "busy",
                "too many messages waiting for the running response",
                in_reply_to=msg.id,
                retryable=True,
            )
        else:
            self._remember(msg.id)
            if self._response is None:
                self._start_response(msg)
            else:
                self._queue.append(msg)

    def _remember(self, msg_id: str | None) -> None:
        if msg_id is None:
            return
        self._message_ids[msg_id] = None
        while len(self._message_ids) > _REMEMBERED_MESSAGE_IDS:
            del self._message_ids[next(iter(self._message_ids))]

    def _start_response(self, msg: UserMessage) -> None:
        self._history.begin_turn()
        # Context that arrived before the user spoke goes before their words.
        self._flush_notes()
        self._history.append(UserTurn(text=msg.text))
        self._response = ResponseState(
            response_id=self._new_id("resp"),
            tool_choice=msg.tool_choice or self._tool_choice,
            tools=msg.tools,
            max_steps=msg.max_steps or self._max_steps,
            tool_mode=msg.tool_mode or self._tool_mode,
            voice=self._segments,
        )
        self._latest = self._response.response_id
        self._out.send(ResponseCreated(response_id=self._response.response_id, in_reply_to=msg.id))
        self._start_step(self._response)

    def _start_completion_response(self, call_id: str) -> None:
        """A response nobody asked for: the model tells the user an async result."""
        self._history.begin_turn()
        self._response = ResponseState(
            response_id=self._new_id("resp"),
            tool_choice=self._tool_choice,
            max_steps=self._max_steps,
            tool_mode=self._tool_mode,
            voice=self._segments,
        )
        self._latest = self._response.response_id
        self._out.send(ResponseCreated(response_id=self._response.response_id, call_id=call_id))
        self._start_step(self._response)

    def _start_next(self) -> None:
        """After a response: the next queued message, else announced async results."""
        if self._queue:
            self._start_response(self._queue.pop(0))
        elif announced := [n for n in self._notes if n.announce]:
            self._start_completion_response(announced[0].note.call_id or "")

    def _start_step(self, response: ResponseState, *, again: bool = False) -> None:
        """Ask the model for the next step of ``response`` (``again``: the same step,
        whose stream was lost)."""
        self._flush_notes()
        self._history.trim()  # never the turn in progress: this response's
        if not again:
            response.steps += 1
        response.step_id = self._new_id("step")
        response.text = []
        if not again:
            response.segmented = 0
        response.requested = []
        narrowed = response.tools
        tools = tuple(
            ToolSchema(name=d.name, description=d.description, input_schema=d.input_schema)
            for d in self._calls.tools.definitions()
            if narrowed is None or d.name in narrowed
        )
        request = ModelRequest(
            instructions=self._instructions,
            items=self._history.items,
            tools=tools,
            tool_choice=step_choice(
                response.tool_choice,
                first_step=response.steps == 1,
                offered=[t.name for t in tools],
            ),
        )
        self._out.do(
            CallModel(response.step_id, response.response_id, request, self._settings.agent)
        )

    def _end_response(self, status: ResponseStatus, *, start_next: bool = True) -> None:
        response = self._response
        assert response is not None
        self._out.send(
            ResponseDone(
                response_id=response.response_id,
                status=status,
                turn_completed=status == "completed",
                usage=response.usage,
            )
        )
        self._response = None
        self._segmenter = None
        if self._ending is not None:  # the agent said goodbye in this response
            self._out.send(SessionEnded(reason=self._ending))
            self._shut_down()
            return
        if start_next:
            self._start_next()

    def _hand_over_if_asked(
        self, event: ToolFinished
    ) -> tuple[ToolFinished, AgentTransferred | None]:
        """A ``transfer_to_agent`` call that returned: the session switches to the agent it
        names now, so the response's next step is that agent's. The event to settle the
        call with (failed, saying why, if the switch cannot be), and the one to send."""
        call = self._calls.ledger.get(event.call_id)
        if call is None or call.settled or event.error is not None:
            return event, None
        entry = self._calls.tools.get(call.tool)
        if entry is None or not entry.definition.transfers:
            return event, None
        name = call.args.get("agent")
        profile = self._settings.agents(name) if isinstance(name, str) else None
        if profile is None or profile.agent == self._settings.agent:
            return ToolFinished(call_id=call.call_id, error=f"no agent {name!r} to go to"), None
        previous, self._settings = self._settings, self._settings.switched(profile)
        try:
            tools = self._registry(self._client_specs)
        except ConfigError as exc:  # a client function clashes with one of its tools
            self._settings = previous
            return ToolFinished(call_id=call.call_id, error=f"cannot transfer: {exc}"), None
        if len(tools) and not profile.model_supports_tools:
            self._settings = previous
            error = f"cannot transfer: the model of {name!r} cannot call tools"
            return ToolFinished(call_id=call.call_id, error=error), None
        self._calls.tools, self._calls.confirm_rules = tools, profile.confirm_rules
        self._calls.agent = profile.agent
        self._instructions = _joined(profile.instructions, self._client_instructions)
        reason = call.args.get("reason")
        return event, AgentTransferred(
            agent=profile.agent,
            previous_agent=previous.agent,
            tools=_tool_infos(tools),
            reason=reason if isinstance(reason, str) and reason else None,
            response_id=call.response_id,
        )

    def _note_ending(self, call_id: str) -> None:
        """A completed ``end_session`` call: the session ends after this response."""
        call = self._calls.ledger.get(call_id)
        if call is None or call.state is not CallState.COMPLETED or self._ending is not None:
            return
        entry = self._calls.tools.get(call.tool)
        if entry is not None and entry.definition.ends_session:
            reason = call.args.get("reason")
            self._ending = reason if isinstance(reason, str) and reason else "goodbye"

    def _truncate(self, msg: ResponseTruncate) -> None:
        """Keep in the history only the part of the latest response the user heard; a
        response still running stops first (the user spoke over it)."""
        if msg.response_id != self._latest:
            self._out.error(
                "invalid_message",
                f"response {msg.response_id[:64]!r} is not the latest one: only it can be"
                " truncated",
                in_reply_to=msg.id,
            )
            return
        running = self._response is not None
        if running:
            self._cancel_response(msg.response_id, start_next=False)
        self._history.truncate_last_turn(msg.heard_chars)
        self._out.send(
            ResponseTruncated(
                response_id=msg.response_id, heard_chars=msg.heard_chars, in_reply_to=msg.id
            )
        )
        if running and self._response is None:
            self._start_next()

    def _cancel_response(
        self,
        response_id: str | None,
        *,
        status: ResponseStatus = "cancelled",
        reason: str = CANCELLED,
        start_next: bool = True,
    ) -> None:
        response = self._response
        # A cancel racing the end of its response is not an error: nothing to stop.
        if response is None or response_id not in (None, response.response_id):
            return
        if response.step_id is not None:
            self._out.do(CancelModel(response.step_id))
            if seen := _seen_text(response):
                self._history.append(AssistantTurn(text=seen))
            response.step_id = None
        # Async calls that are pending outlive the response; the rest stop now.
        for call in response.calls:
            if call.blocking:
                self._calls.cancel(call, reason)
        self._record_outcomes(response)
        self._end_response(status, start_next=start_next)

    def _deliver(self, completion: Completion) -> None:
        """Give an async call's outcome to the model, as its ``delivery`` says."""
        call = completion.call
        note = ContextNote(text=completion.note, call_id=call.call_id)
        call.slim()  # the note has the outcome now
        self._notes.append(PendingNote(note=note, announce=call.delivery != "silent"))
        if call.delivery == "silent":
            return
        if call.delivery == "interrupt" and self._response is not None:
            self._cancel_response(None, start_next=False)
        if self._response is None:
            self._start_completion_response(call.call_id)
        # when_idle with a response running: the note joins its next model step.

    def _flush_notes(self) -> None:
        self._history.extend([pending.note for pending in self._notes])
        self._notes.clear()

    # ----------------------------------------------------------------- model

    def _on_model_event(self, step_id: str, event: ModelEvent) -> None:
        response = self._response
        if response is None or response.step_id != step_id:
            return  # output of a cancelled step: dropped, never sent
        match event:
            case ModelText(text=text) if text:
                self._on_text(response, text)
            case ModelToolCall():
                response.requested.append(event)
            case ModelFinish(usage=usage):
                if usage is not None:
                    response.usage.input_tokens += usage.input_tokens
                    response.usage.output_tokens += usage.output_tokens
                self._finish_step(response)
            case ModelRetrying(attempt=attempt, delay=delay, reason=reason):
                self._out.send(
                    ResponseRetrying(
                        response_id=response.response_id,
                        attempt=attempt,
                        delay=round(delay, 3),
                        reason=reason,
                    )
                )

    def _on_text(self, response: ResponseState, text: str) -> None:
        segmenter = self._segmenter_for(response) if response.voice else None
        unsent = self._confirm(response, text) if response.unconfirmed else text
        if unsent is None:
            return
        response.text.append(text)
        if unsent:
            self._out.send(TextDelta(response_id=response.response_id, delta=unsent))
            if segmenter is not None:
                self._send_segments(response, segmenter.feed(unsent))

    def _segmenter_for(self, response: ResponseState) -> Segmenter:
        """The running response's segmenter; after a restore, a new one fed with what the
        client has of the step, its segments sent already (``segmented``) not sent again."""
        if (segmenter := self._segmenter) is not None:
            return segmenter
        segmenter = self._segmenter = Segmenter(
            first_min_chars=None if response.segments else DEFAULT_FIRST_MIN_CHARS
        )
        sent = response.segmented
        unsent = []
        for piece in segmenter.feed(_seen_text(response)):
            if sent >= len(piece):
                sent -= len(piece)
            else:
                unsent.append(piece)
        self._send_segments(response, unsent)
        return segmenter

    def _send_segments(self, response: ResponseState, pieces: list[str]) -> None:
        for piece in pieces:
            response.segmented += len(piece)
            response.segments += 1
            self._out.send(TextSegment(response_id=response.response_id, text=piece))

    def _end_step_text(self, response: ResponseState, text: str) -> None:
        """The step's text is complete: its last segment (voice), then ``text.done``."""
        if response.voice and (rest := self._segmenter_for(response).flush()) is not None:
            self._send_segments(response, [rest])
        self._out.send(TextDone(response_id=response.response_id, text=text))

    def _on_model_failed(self, event: ModelFailed) -> None:
        response = self._response
        if response is None or response.step_id != event.step_id:
            return
        seen = _seen_text(response)
        streamed = bool(seen)
        if streamed:
            self._history.append(AssistantTurn(text=seen))
        response.step_id = None
        self._out.error(
            "provider_error",
            event.message,
            retryable=event.retryable,
            response_id=response.response_id,
        )
        # Cut after text reached the user: incomplete; nothing said at all: failed.
        self._end_response("incomplete" if streamed else "failed")

    def _confirm(self, response: ResponseState, text: str) -> str | None:
        """The part of ``text`` (from a step run again) the client does not have yet; or
        ``None`` when it contradicts what the client has (the response then ends)."""
        unconfirmed = response.unconfirmed
        common = min(len(unconfirmed), len(text))
        if text[:common] != unconfirmed[:common]:
            self._interrupted(response)
            return None
        response.unconfirmed = unconfirmed[common:]
        return text[common:]

    def _interrupted(self, response: ResponseState) -> None:
        """A step run again after its node stopped did not say what the client already
        has: end the response with what the client saw."""
        assert response.step_id is not None
        self._out.do(CancelModel(response.step_id))
        self._history.append(AssistantTurn(text=_seen_text(response)))
        response.step_id = None
        self._out.error(
            "response_interrupted",
            "the gateway node running this response stopped, and the model's new attempt"
            " did not continue the text already sent",
            retryable=True,
            response_id=response.response_id,
        )
        self._end_response("incomplete")

    def _finish_step(self, response: ResponseState) -> None:
        if response.unconfirmed:  # the new attempt said less than the client has
            self._interrupted(response)
            return
        text = "".join(response.text)
        response.step_id = None
        max_steps = response.max_steps or self._settings.limits.max_steps
        if response.requested and response.steps >= max_steps:
            # No step is left to use their results, so the calls are not run at all.
            self._history.append(AssistantTurn(text=text))
            if text:
                self._end_step_text(response, text)
            self._out.error(
                "max_steps_exceeded",
                f"the model asked for tools after its last allowed step ({response.steps})",
                response_id=response.response_id,
            )
            self._end_response("incomplete")
            return
        if text:
            self._end_step_text(response, text)
        if not response.requested:
            self._history.append(AssistantTurn(text=text))
            self._end_response("completed")
            return
        response.calls = self._calls.start(
            response.requested,
            response_id=response.response_id,
            now=self._now,
            refuse=lambda tool: refusal(tool, response.tool_choice, response.tools),
            manual=response.tool_mode == "manual",
        )
        self._history.append(
            AssistantTurn(
                text=text,
                calls=tuple(
                    RequestedCall(call_id=c.call_id, name=c.tool, args=c.args)
                    for c in response.calls
                ),
            )
        )
        self._advance_if_step_settled()

    def _advance_if_step_settled(self) -> None:
        response = self._response
        if response is None or response.step_id is not None or not response.calls:
            return
        if not any(call.blocking for call in response.calls):
            self._record_outcomes(response)
            self._start_step(response)

    def _record_outcomes(self, response: ResponseState) -> None:
        self._history.extend([self._calls.outcome(call) for call in response.calls])
        for call in response.calls:
            if call.settled:
                call.slim()
        response.calls = []


def _joined(instructions: str, added: str | None) -> str:
    """An agent's instructions with what the client added to them."""
    return f"{instructions}\n\n{added}".strip() if added else instructions


def _tool_infos(tools: ToolRegistry) -> list[ToolInfo]:
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


LOG_ONLY = (Ping, Ack, DecodeFailure)
"""Client messages whose only mark on the state is what they send (a pong, an error about
the frame): a durable store need not save the state for them (``catch_up``)."""


def _about_a_frame(error: Error) -> bool:
    """An error a ``DecodeFailure`` causes (the frame was unreadable, unknown or refused)."""
    return (
        error.response_id is None
        and error.call_id is None
        and error.code
        in (
            "invalid_message",
            "unknown_type",
            "rate_limited",
            "message_too_large",
        )
    )


def _seen_text(response: ResponseState) -> str:
    """The text of the current step the client has."""
    return "".join(response.text) + response.unconfirmed


def _id_of(event: Event) -> str | None:
    return getattr(event, "id", None)

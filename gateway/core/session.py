"""The session core: a pure state machine, events in, effects out.

It never awaits, reads a clock or touches a socket. The driver feeds it events
(client messages, model output, tool outcomes, ticks) with the current time and
executes the effects it returns (send a message, call the model, run a tool).
Bad peer input never raises out of ``receive``: it becomes an ``error`` event.

This module owns sessions: their lifecycle (start, update, hand-over to another agent,
end), their events (``receive``) and the session as a value (``state``, ``restore``,
``catch_up``). ``conversation`` owns the responses (turns, model steps, cancellation,
delivery of async results), ``toolset`` the tools a session offers and ``dispatch`` the
tool calls. ``SessionSettings`` and ``AgentProfile`` (``session_settings``) are imported
from here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from gateway.core.call import Call, CallState, Ledger
from gateway.core.event import (
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
from gateway.core.history import History, Mark
from gateway.core.inbound import (
    Ack,
    DecodeFailure,
    Ping,
    ResponseCancel,
    ResponseTruncate,
    SessionResume,
    SessionStart,
    SessionUpdate,
    ToolConfirmation,
    ToolResults,
    ToolRun,
    ToolSpec,
    UserMessage,
)
from gateway.core.outbound import (
    PROTOCOL_VERSION,
    AgentTransferred,
    ClientCall,
    ConfirmItem,
    Error,
    Pong,
    ResponseTruncated,
    ServerMsg,
    SessionCreated,
    SessionSnapshot,
    SessionUpdated,
    TextDelta,
    TranscriptEntry,
)
from gateway.core.principal import Principal
from gateway.core.responses import Responses, seen_text
from gateway.core.settings import AgentProfile, SessionSettings
from gateway.core.state import Phase, SessionState
from gateway.core.tool import ToolRegistry
from gateway.core.toolset import Refusal, tool_infos
from gateway.core.transcript import AssistantTurn, Item, UserTurn
from gateway.errors import ConfigError

__all__ = ["AgentProfile", "Session", "SessionSettings"]

_REMEMBERED_MESSAGE_IDS = 1_000


class Session(Responses):
    """One conversation's protocol state. See the module docstring."""

    def __init__(
        self,
        settings: SessionSettings,
        *,
        session_id: str,
        resume_token: str,
        new_id: Callable[[str], str],
    ) -> None:
        super().__init__(settings, new_id=new_id)
        self.session_id = session_id
        self._resume_token = resume_token
        self.metadata: dict[str, Any] = {}
        """What the client sent in ``session.start``; kept for the application."""
        self._client_instructions: str | None = None
        """What the client added to the agent's instructions (kept across transfers)."""
        self._message_ids: dict[str, None] = {}
        """Ids of recent user messages, oldest first (a dict keeps insertion order)."""
        self.time_zone: str | None = None
        """The user's time zone, from ``session.start`` (for tools that tell the time)."""

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
        session._toolset.client_specs = state.client_functions
        session._tool_choice, session._max_steps = state.tool_choice, state.max_steps
        session._tool_mode = state.tool_mode
        session.time_zone = state.time_zone
        session._ending = state.ending
        session._latest = state.latest_response
        session._segments = state.segments
        session._calls.tools = session._toolset.registry(state.client_functions)
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
            client_functions=self._toolset.client_specs,
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

    def call(self, call_id: str) -> Call | None:
        """The call ``call_id`` names, while the ledger keeps it."""
        return self._calls.ledger.get(call_id)

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

    def recover(self, event: Event, *, now: float) -> None:
        """``receive`` raised applying ``event`` (the gateway's bug, or a model's output it
        cannot handle): carry on. A step whose output it was fails as a model failure does;
        otherwise the response running now ends (``internal`` error, then ``response.done``),
        so that no response is left open; with none running, the message is answered with
        an ``internal`` error. The effects queued before the failure stay, in order."""
        self._now = now
        if self._phase is Phase.CLOSED:
            return
        response = self._response
        if (
            isinstance(event, ModelOutput)
            and response is not None
            and response.step_id == event.step_id
        ):
            self._on_model_failed(
                ModelFailed(event.step_id, "the gateway could not handle the model's output")
            )
        elif response is not None:
            self._fail_running("the gateway failed in the middle of this response")
        else:
            self._out.error(
                "internal",
                "the gateway failed to apply this message",
                in_reply_to=getattr(event, "id", None),
            )

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
            response.text, response.unconfirmed = [seen_text(response)], ""
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
        response.unconfirmed = seen_text(response)
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
        tools = self._tools_with(msg.client_functions, msg.id)
        if tools is None:
            return
        if not self._choice_fits(tools, msg.tool_choice, msg.max_steps, None, msg.id):
            return
        self._calls.tools, self._toolset.client_specs = tools, msg.client_functions
        self._tool_choice = msg.tool_choice or "auto"
        self._max_steps = msg.max_steps
        self._tool_mode = msg.tool_mode or "auto"
        self._segments = bool(msg.segments)
        self.time_zone = msg.time_zone
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
                tools=tool_infos(tools),
                limits=self._settings.limits,
            )
        )

    def _update_session(self, msg: SessionUpdate) -> None:
        """Replace the client's own functions, extra instructions, default ``tool_choice``
        or ``max_steps`` mid-session (all of them, or none after an error)."""
        tools, specs = self._calls.tools, self._toolset.client_specs
        if msg.client_functions is not None:
            changed = self._tools_with(msg.client_functions, msg.id)
            if changed is None:
                return
            tools, specs = changed, msg.client_functions
        choice = msg.tool_choice or self._tool_choice
        if not self._choice_fits(tools, choice, msg.max_steps, None, msg.id):
            return
        self._calls.tools, self._toolset.client_specs = tools, specs
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
        self._out.send(SessionUpdated(tools=tool_infos(self._calls.tools), in_reply_to=msg.id))

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
        problem = self._toolset.choice_problem(tools, choice, max_steps, narrowed)
        if problem is not None:
            self._out.error("invalid_message", problem, in_reply_to=msg_id)
        return problem is None

    def _tools_with(self, specs: list[ToolSpec], msg_id: str | None) -> ToolRegistry | None:
        """The agent's tools plus the client's functions among ``specs``; ``None`` after an
        error (``Toolset.accepted`` says why)."""
        tools = self._toolset.accepted(specs)
        if isinstance(tools, Refusal):
            self._out.error(tools.code, tools.message, in_reply_to=msg_id)
            return None
        return tools

    def declared_schemas(self, msg: SessionStart | SessionUpdate) -> list[dict[str, Any]]:
        """The schemas ``msg`` declares that the session will check, in the order it checks
        them (so the driver can have them checked off the event loop first)."""
        return self._toolset.declared_schemas(msg.client_functions or [])

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
        try:
            toolset, tools = self._toolset.handed_to(profile)
        except ConfigError as exc:  # a client function clashes with one of its tools
            return ToolFinished(call_id=call.call_id, error=f"cannot transfer: {exc}"), None
        if len(tools) and not profile.model_supports_tools:
            error = f"cannot transfer: the model of {name!r} cannot call tools"
            return ToolFinished(call_id=call.call_id, error=error), None
        previous, self._toolset = self._settings, toolset
        self._calls.tools, self._calls.confirm_rules = tools, profile.confirm_rules
        self._calls.agent = profile.agent
        self._instructions = _joined(profile.instructions, self._client_instructions)
        reason = call.args.get("reason")
        return event, AgentTransferred(
            agent=profile.agent,
            previous_agent=previous.agent,
            tools=tool_infos(tools),
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


def _joined(instructions: str, added: str | None) -> str:
    """An agent's instructions with what the client added to them."""
    return f"{instructions}\n\n{added}".strip() if added else instructions


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


def _id_of(event: Event) -> str | None:
    return getattr(event, "id", None)

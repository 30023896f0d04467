"""The session core: a pure state machine, events in, effects out.

It never awaits, reads a clock or touches a socket. The driver feeds it events
(client messages, model output, tool outcomes, ticks) with the current time and
executes the effects it returns (send a message, call the model, run a tool).
Bad peer input never raises out of ``receive``: it becomes an ``error`` event.

This module owns sessions: their lifecycle (start, update, end), their events
(``receive``) and the session as a value (``state``, ``restore``, ``catch_up``). A session
*is* its ``SessionState``: it holds that one value and changes it in place, and so do
the collaborators it hands events to: ``terms`` (what the session runs under: the agent
and the hand-over to another, the tools, instructions and defaults, the agent's end of
it), ``intake`` (which user messages it takes), ``responses`` (turns, model steps,
cancellation, delivery of async results) and ``dispatch`` (the tool calls).
``SessionSettings`` and ``AgentProfile`` (``settings``) are imported from here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gateway.core.audio import AudioSettings
from gateway.core.call import Call, Ledger
from gateway.core.dispatch import Dispatcher
from gateway.core.event import (
    Disconnected,
    Effect,
    Event,
    ModelFailed,
    ModelOutput,
    SegmentSpoken,
    ShuttingDown,
    SpeechDone,
    SpeechStarted,
    SpeechStopped,
    Tick,
    ToolDeferred,
    ToolFinished,
    ToolHandle,
    ToolProgress,
    Transcribed,
    VoiceFailed,
)
from gateway.core.history import History, Mark
from gateway.core.inbound import (
    Ack,
    DecodeFailure,
    InputAudioClear,
    InputAudioCommit,
    Ping,
    ResponseCancel,
    ResponseTruncate,
    SessionAttach,
    SessionResume,
    SessionStart,
    SessionUpdate,
    ToolConfirmation,
    ToolResults,
    ToolRun,
    ToolSpec,
    UserMessage,
)
from gateway.core.intake import Intake
from gateway.core.model import ModelRequest, ToolSchema
from gateway.core.outbound import (
    FIRST_DEVICE,
    PROTOCOL_VERSION,
    ClientCall,
    ConfirmItem,
    Error,
    Pong,
    ServerMsg,
    SessionCreated,
    SessionSnapshot,
    SessionUpdated,
    TextDelta,
    TranscriptEntry,
)
from gateway.core.outbox import Outbox
from gateway.core.principal import Principal
from gateway.core.responses import Responses, seen_text
from gateway.core.settings import AgentProfile, SessionSettings
from gateway.core.speech import Speech
from gateway.core.state import Phase, SessionState, new_state
from gateway.core.terms import Terms
from gateway.core.tool import ToolRegistry
from gateway.core.toolset import Toolset, tool_infos
from gateway.core.transcript import AssistantTurn, Item, UserTurn
from gateway.errors import ConfigError

__all__ = ["AgentProfile", "Session", "SessionSettings"]


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
        state = new_state(
            session_id=session_id,
            principal=settings.principal,
            instructions=settings.instructions,
            agent=settings.agent,
        )
        toolset = Toolset(settings, state.client_functions)
        self._hold(state, toolset, settings.tools, resume_token=resume_token, new_id=new_id)

    @classmethod
    def restore(
        cls, settings: SessionSettings, state: SessionState, *, new_id: Callable[[str], str]
    ) -> Session:
        """Carry on a session from its ``state()``, in this process or another.

        The session takes ``state`` over: it changes it in place from then on (its
        transcript and calls move to the session's history and ledger). The session
        belongs to the principal the state names (``settings.principal`` is replaced by
        it); the agent's tools and the limits come from ``settings`` (from
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
        toolset = Toolset(settings, state.client_functions)
        tools = toolset.registry(state.client_functions)
        state.agent = settings.agent  # an older state names none: the gateway's own
        session = cls.__new__(cls)
        session._hold(state, toolset, tools, resume_token="", new_id=new_id)
        return session

    def _hold(
        self,
        state: SessionState,
        toolset: Toolset,
        tools: ToolRegistry,
        *,
        resume_token: str,
        new_id: Callable[[str], str],
    ) -> None:
        """Be the session ``state`` is, with the collaborators that change it. Three keep
        a part of it in a form of their own, which ``state()`` puts back: the outbox
        numbers events (``seq``), the ledger finds calls by id (``calls``), the history
        knows the size of each item (``history``, ``turn_starts``)."""
        settings = toolset.settings
        self._state = state
        self._resume_token = resume_token
        self._out = Outbox()
        self._out.seq = state.seq
        ledger = Ledger.restore(state.calls)
        self._calls = Dispatcher(self._out, settings, tools=tools, new_id=new_id, ledger=ledger)
        self._history = History.restore(
            settings.max_history_chars, state.history, state.turn_starts
        )
        state.calls, state.history, state.turn_starts = [], [], []  # theirs from now on
        if (response := state.response) is not None:
            # The response's calls are the ledger's: one object per call, as before.
            response.calls = [ledger.get(call.call_id) or call for call in response.calls]
        self._terms = Terms(state, toolset, calls=self._calls, outbox=self._out)
        self._intake = Intake(state, terms=self._terms, calls=self._calls, outbox=self._out)
        self._responses = Responses(
            state,
            terms=self._terms,
            calls=self._calls,
            history=self._history,
            outbox=self._out,
            new_id=new_id,
        )
        self._speech = Speech(
            state,
            intake=self._intake,
            responses=self._responses,
            outbox=self._out,
            new_id=new_id,
            voices=settings.voices,
        )
        self._on_text = self._responses.on_text
        """Bound once: every text delta of every answer comes this way (``model_text``)."""

    def state(self, *, with_history: bool = True) -> SessionState:
        """Everything this session is, as one value: the state it holds, with the parts
        its collaborators keep put back (a view: it shares this session's objects, so
        encode it before the next ``receive``). Without history, its transcript is left
        out (a store that keeps it apart, see ``history_since``)."""
        history = self._history
        return msgspec.structs.replace(
            self._state,
            seq=self._out.seq,
            calls=self._calls.ledger.calls(),
            history=list(history.items) if with_history else [],
            turn_starts=history.turn_starts,
        )

    # ----------------------------------------------------------------- public

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def metadata(self) -> dict[str, Any]:
        """What the client sent in ``session.start``; kept for the application."""
        return self._state.metadata

    @property
    def audio(self) -> AudioSettings | None:
        """The session's audio, while it is on (the voice pipeline listens under it)."""
        return self._state.audio

    @property
    def time_zone(self) -> str | None:
        """The user's time zone, from ``session.start`` (for tools that tell the time)."""
        return self._state.time_zone

    @property
    def closed(self) -> bool:
        return self._state.phase is Phase.CLOSED

    @property
    def client_functions(self) -> list[ToolSpec]:
        """The functions the session's clients declared (every device's), as offered."""
        return self._state.client_functions

    @property
    def ended_by_agent(self) -> bool:
        """The session is over because the agent ended it (``session.ended`` was sent)."""
        return self._state.phase is Phase.CLOSED and self._state.ending is not None

    @property
    def agent(self) -> str:
        """The agent the session is with (another after ``transfer_to_agent``)."""
        return self._terms.settings.agent

    def call(self, call_id: str) -> Call | None:
        """The call ``call_id`` names, while the ledger keeps it."""
        return self._calls.ledger.get(call_id)

    @property
    def principal(self) -> Principal:
        """Who the session belongs to, with the end user's claims (for tools)."""
        return self._state.principal

    def model_text(self, step_id: str, text: str, *, now: float) -> None:
        """``receive(ModelOutput(step_id, ModelText(text)), now=now)``, for the event
        that comes most by far (every delta of every answer), without building the event
        and matching it to find what it is."""
        response = self._state.response  # none once the session is closed
        if response is not None and response.step_id == step_id and text:
            self._on_text(response, text)

    def recover(self, event: Event, *, now: float) -> None:
        """``receive`` raised applying ``event`` (the gateway's bug, or a model's output it
        cannot handle): carry on. A step whose output it was fails as a model failure does;
        otherwise the response running now ends (``internal`` error, then ``response.done``),
        so that no response is left open; with none running, the message is answered with
        an ``internal`` error. The effects queued before the failure stay, in order."""
        state = self._state
        if state.phase is Phase.CLOSED:
            return
        response = state.response
        if (
            isinstance(event, ModelOutput)
            and response is not None
            and response.step_id == event.step_id
        ):
            self._responses.on_model_failed(
                ModelFailed(event.step_id, "the gateway could not handle the model's output")
            )
        elif response is not None:
            self._responses.fail_running("the gateway failed in the middle of this response")
        else:
            self._out.error(
                "internal",
                "the gateway failed to apply this message",
                in_reply_to=_id_of(event),
            )

    def receive(self, event: Event, *, now: float) -> None:
        """Apply one event. Effects accumulate until ``effects()`` is called."""
        state = self._state
        if state.phase is Phase.CLOSED:
            return
        responses = self._responses
        match event:
            case ModelOutput(step_id=step_id, event=model_event):  # the most frequent first
                responses.on_model_event(step_id, model_event, now)
            case DecodeFailure(code=code, message=message, in_reply_to=in_reply_to):
                self._out.error(code, message, in_reply_to=in_reply_to, retryable=event.retryable)
            case Ping(ts=ts):
                self._out.send(Pong(ts=ts))
            case SessionStart():
                self._start_session(event)
            case SessionResume() | SessionAttach():
                self._out.error(
                    "invalid_message",
                    f"{event.__struct_config__.tag} must be the first message on a new socket",
                    in_reply_to=event.id,
                )
            case Disconnected():
                responses.shut_down()
            case ShuttingDown():
                if state.response is not None:
                    responses.cancel(
                        None,
                        status="incomplete",
                        reason="cancelled: the gateway is restarting",
                        start_next=False,
                    )
                state.queue.clear()
            case _ if state.phase is Phase.NEW and not isinstance(event, Tick):
                self._out.error(
                    "invalid_message", "send session.start first", in_reply_to=_id_of(event)
                )
            case Ack():
                pass  # the driver trims the event log; nothing changes in the session
            case SessionUpdate():
                can, audio = self._speech.settings_for(event.audio, event.id)
                if can and self._terms.update(event):
                    self._speech.apply(audio)
                    tools = tool_infos(self._calls.tools)
                    self._out.send(
                        SessionUpdated(tools=tools, in_reply_to=event.id, audio=state.audio)
                    )
            case UserMessage():
                if self._intake.admit(event):
                    if state.response is None:
                        self._start_response(event)
                    else:
                        state.queue.append(event)
            case ToolResults():
                for result in event.results:
                    self._calls.accept_client_result(result, event.id)
                    self._terms.note_ending(result.call_id)
                responses.advance_if_step_settled()
            case ToolRun():
                self._calls.run_on_gateway(event, now)
                responses.advance_if_step_settled()
            case ToolConfirmation():
                self._calls.confirmation(event, now)
                responses.advance_if_step_settled()
            case ResponseCancel(response_id=response_id):
                responses.cancel(response_id)
            case ResponseTruncate():
                responses.truncate(event)
            case ModelFailed():
                responses.on_model_failed(event)
            case ToolFinished():
                event, transferred = self._terms.hand_over_if_asked(event)
                completion = self._calls.tool_finished(event)
                if transferred is not None:
                    self._out.send(transferred)
                self._terms.note_ending(event.call_id)
                if completion is not None:
                    responses.deliver(completion)
                responses.advance_if_step_settled()
            case ToolProgress():
                self._calls.tool_progress(event)
            case ToolDeferred():
                self._calls.tool_deferred(event)
                responses.advance_if_step_settled()
            case ToolHandle():
                self._calls.tool_handle(event)
            case Tick():
                for completion in self._calls.expire_due(now):
                    responses.deliver(completion)
                responses.advance_if_step_settled()
            case (
                Transcribed()
                | SpeechStarted()
                | SpeechStopped()
                | SegmentSpoken()
                | SpeechDone()
                | InputAudioCommit()
                | InputAudioClear()
                | VoiceFailed()
            ):
                self._speech.receive(event)

    def model_request(self) -> ModelRequest:
        """What a model would get for a step now (every tool offered): how a model that
        keeps a session of its own (a speech-to-speech one) is set up."""
        return ModelRequest(
            instructions=self._state.instructions,
            items=self._history.items,
            tools=tuple(
                ToolSchema(name=d.name, description=d.description, input_schema=d.input_schema)
                for d in self._calls.tools.definitions()
            ),
        )

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
        response = self._state.response
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
        self._calls.adopt()
        state = self._state
        response = state.response
        if state.phase is not Phase.OPEN or response is None or response.step_id is None:
            return
        self._responses.run_step_again(response)

    def effects(self) -> list[Effect]:
        """Take the effects produced since the last call, in order."""
        return self._out.take()

    def next_deadline(self) -> float | None:
        """When the session next needs a ``Tick``, or ``None``."""
        return self._calls.ledger.next_deadline()

    @property
    def started(self) -> bool:
        return self._state.phase is not Phase.NEW

    @property
    def responding(self) -> bool:
        """True while a response runs (or user messages wait for one)."""
        state = self._state
        return state.response is not None or bool(state.queue)

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
            session_id=self._state.session_id,
            last_seq=self._out.seq,
            agent=self.agent,
            transcript=transcript,
            open_calls=self.open_client_calls(now),
            open_confirmations=self.open_confirmations(now),
        )

    def declared_schemas(self, msg: SessionStart | SessionUpdate) -> list[dict[str, Any]]:
        """The schemas ``msg`` declares that the session will check, in the order it checks
        them (so the driver can have them checked off the event loop first)."""
        return self._terms.declared_schemas(msg)

    # ----------------------------------------------------------------- lifecycle

    def _start_session(self, msg: SessionStart) -> None:
        state = self._state
        if state.phase is not Phase.NEW:
            self._out.error(
                "invalid_message", "the session has already started", in_reply_to=msg.id
            )
            return
        can, audio = self._speech.settings_for(msg.audio, msg.id)
        if not can or not self._terms.start(msg):
            return
        self._speech.apply(audio)
        state.phase = Phase.OPEN
        state.metadata = msg.metadata
        state.time_zone = msg.time_zone
        settings = self._terms.settings
        self._out.send(
            SessionCreated(
                session_id=state.session_id,
                resume_token=self._resume_token,
                protocol_version=PROTOCOL_VERSION,
                agent=settings.agent,
                tools=tool_infos(self._calls.tools),
                limits=settings.limits,
                audio=state.audio,
                voices=list(settings.voices),
                device_id=FIRST_DEVICE,
            )
        )

    def _start_response(self, msg: UserMessage) -> None:
        """Start the response to ``msg``: none runs now."""
        self._responses.start(msg)


LOG_ONLY = (Ping, Ack, DecodeFailure)
"""Client messages whose only mark on the state is what they send (a pong, an error about
the frame): a durable store need not save the state for them (``catch_up``)."""


_FRAME_ERRORS = (
    "invalid_message",
    "unknown_type",
    "rate_limited",
    "message_too_large",
    "invalid_audio",
)
"""The codes of the errors a ``DecodeFailure`` causes."""


def _about_a_frame(error: Error) -> bool:
    """An error a ``DecodeFailure`` causes (the frame was unreadable, unknown or refused)."""
    return error.response_id is None and error.call_id is None and error.code in _FRAME_ERRORS


def _id_of(event: Event) -> str | None:
    return getattr(event, "id", None)

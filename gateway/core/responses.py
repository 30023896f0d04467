"""A session's responses: turns, model steps, cancellation, delivery of async results.

Part of the pure session core: it never awaits, reads a clock or touches a socket. One
response runs at a time, a model step after another until the model asks for no tool;
user messages that arrive meanwhile wait in a queue, and the outcomes of async calls wait
as notes for the next step (or start a response of their own). ``dispatch`` owns the tool
calls.

``Responses`` is a collaborator of ``Session`` (``gateway.core.session``), which takes the
session's events and hands it those about responses. Both hold the same ``SessionState``
(the running response, the queue, the notes are fields of it) and change it in place.
Every text delta of every answer comes through ``on_text``: the session binds it once.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gateway.core.audio import SpokenAudio, heard_chars, word_end
from gateway.core.dispatch import Completion, Dispatcher
from gateway.core.event import CallModel, CancelModel, EndSpeech, ModelFailed, Speak
from gateway.core.history import History
from gateway.core.inbound import ResponseStatus, ResponseTruncate, UserMessage
from gateway.core.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelRetrying,
    ModelText,
    ModelToolCall,
    ToolSchema,
)
from gateway.core.outbound import (
    Error,
    ResponseCreated,
    ResponseDone,
    ResponseRetrying,
    ResponseTruncated,
    SessionEnded,
    TextDelta,
    TextDone,
    TextSegment,
)
from gateway.core.outbox import Outbox
from gateway.core.segments import DEFAULT_FIRST_MIN_CHARS, Segmenter
from gateway.core.state import PendingNote, Phase, ResponseState, SessionState
from gateway.core.terms import Terms
from gateway.core.tool_choice import refusal, step_choice
from gateway.core.transcript import CANCELLED, AssistantTurn, ContextNote, RequestedCall, UserTurn

__all__ = ["Responses", "seen_text"]


class Responses:
    """The responses of one session; see the module docstring.

    Args:
        state: the session's state (its response, queue, notes and defaults).
        terms: what the session runs under (the agent whose model answers, the limits).
        calls: the dispatcher of the session's tool calls.
        history: the transcript the model gets.
        outbox: where events and effects go.
        new_id: makes the ids of responses and steps.
    """

    __slots__ = (
        "_calls",
        "_history",
        "_new_id",
        "_out",
        "_segmenter",
        "_state",
        "_terms",
    )  # one of each per session: no __dict__ each

    def __init__(
        self,
        state: SessionState,
        *,
        terms: Terms,
        calls: Dispatcher,
        history: History,
        outbox: Outbox,
        new_id: Callable[[str], str],
    ) -> None:
        self._state = state
        self._terms = terms
        self._calls = calls
        self._history = history
        self._out = outbox
        self._new_id = new_id
        self._segmenter: Segmenter | None = None
        """Cuts the running response's text into segments; made again after a restore
        (``_segmenter_for``)."""

    # ----------------------------------------------------------------- responses

    def start(self, msg: UserMessage) -> None:
        """Start the response to ``msg`` (none runs now)."""
        self._history.begin_turn()
        # Context that arrived before the user spoke goes before their words.
        self._flush_notes()
        self._history.append(UserTurn(text=msg.text))
        state = self._state
        response = state.response = ResponseState(
            response_id=self._new_id("resp"),
            tool_choice=msg.tool_choice or state.tool_choice,
            tools=msg.tools,
            max_steps=msg.max_steps or state.max_steps,
            tool_mode=msg.tool_mode or state.tool_mode,
            voice=state.segments or state.audio is not None,
            spoken=state.audio is not None,
            in_reply_to=msg.id,
        )
        self._became_latest(response)
        self._out.send(ResponseCreated(response_id=response.response_id, in_reply_to=msg.id))
        self._start_step(response)

    def _start_completion_response(self, call_id: str) -> None:
        """A response nobody asked for: the model tells the user an async result."""
        self._history.begin_turn()
        state = self._state
        response = state.response = ResponseState(
            response_id=self._new_id("resp"),
            tool_choice=state.tool_choice,
            max_steps=state.max_steps,
            tool_mode=state.tool_mode,
            voice=state.segments or state.audio is not None,
            spoken=state.audio is not None,
        )
        self._became_latest(response)
        self._out.send(ResponseCreated(response_id=response.response_id, call_id=call_id))
        self._start_step(response)

    def _became_latest(self, response: ResponseState) -> None:
        """``response`` is the latest one now (``response.truncate`` names it)."""
        state = self._state
        state.latest_response = response.response_id
        if response.spoken:
            state.spoken = SpokenAudio(response_id=response.response_id)

    def start_next(self) -> None:
        """After a response: the next queued message, else announced async results."""
        state = self._state
        if state.queue:
            self.start(state.queue.pop(0))
        elif announced := [n for n in state.notes if n.announce]:
            self._start_completion_response(announced[0].note.call_id or "")

    def _start_step(self, response: ResponseState, *, again: bool = False) -> None:
        """Ask the model for the next step of ``response`` (``again``: the same step,
        whose stream was lost)."""
        if not again:
            # Not when a step runs again on the node that took the session over: its
            # request is the lost attempt's, word for word, so that a deterministic model
            # says the same text; notes that came meanwhile go with the next step.
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
            instructions=self._state.instructions,
            items=self._history.items,
            tools=tools,
            tool_choice=step_choice(
                response.tool_choice,
                first_step=response.steps == 1,
                offered=[t.name for t in tools],
            ),
        )
        self._out.do(
            CallModel(response.step_id, response.response_id, request, self._terms.settings.agent)
        )

    def run_step_again(self, response: ResponseState) -> None:
        """The step ``response`` was streaming on a node that stopped runs again here, and
        what the client has of its text is not sent twice (``Session.adopt``)."""
        assert response.step_id is not None
        self._out.do(CancelModel(response.step_id))  # in case it still runs here
        self._segmenter = None  # made again from what the client has
        response.unconfirmed = seen_text(response)
        self._start_step(response, again=True)

    def _end_response(self, status: ResponseStatus, *, start_next: bool = True) -> None:
        state = self._state
        response = state.response
        assert response is not None
        self._out.send(
            ResponseDone(
                response_id=response.response_id,
                status=status,
                turn_completed=status == "completed",
                usage=(
                    msgspec.structs.replace(response.usage, cost=None)
                    if response.cost_unknown
                    else response.usage
                ),
            )
        )
        if response.spoken:
            self._out.do(EndSpeech(response.response_id))
        state.response = None
        self._segmenter = None
        if state.ending is not None:  # the agent said goodbye in this response
            self._out.send(SessionEnded(reason=state.ending))
            self.shut_down()
            return
        if start_next:
            self.start_next()

    def shut_down(self) -> None:
        """The session is over: stop what runs, drop what waits."""
        state = self._state
        response = state.response
        if response is not None and response.step_id is not None:
            self._out.do(CancelModel(response.step_id))
        self._calls.drop_all()
        state.response = None
        state.queue.clear()
        state.phase = Phase.CLOSED

    def cancel(
        self,
        response_id: str | None,
        *,
        status: ResponseStatus = "cancelled",
        reason: str = CANCELLED,
        start_next: bool = True,
    ) -> None:
        """Stop the running response (``response_id``, or whichever runs: ``None``) and
        end it with ``status``; its blocking calls are cancelled for ``reason``."""
        response = self._state.response
        # A cancel racing the end of its response is not an error: nothing to stop.
        if response is None or response_id not in (None, response.response_id):
            return
        if response.step_id is not None:
            self._out.do(CancelModel(response.step_id))
            if seen := seen_text(response):
                self._history.append(AssistantTurn(text=seen))
            response.step_id = None
        # Async calls that are pending outlive the response; the rest stop now.
        for call in response.calls:
            if call.blocking:
                self._calls.cancel(call, reason)
        self._record_outcomes(response)
        self._end_response(status, start_next=start_next)

    def truncate(self, msg: ResponseTruncate) -> None:
        """Keep in the history only the part of the latest response the user heard (in
        characters, or in milliseconds of its audio); a response still running stops first
        (the user spoke over it)."""
        state = self._state
        problem = None
        if msg.response_id != state.latest_response:
            problem = (
                f"response {msg.response_id[:64]!r} is not the latest one: only it can be truncated"
            )
        elif (msg.heard_chars is None) == (msg.audio_end_ms is None):
            problem = "give one of heard_chars and audio_end_ms"
        elif msg.audio_end_ms is not None and (
            state.spoken is None or state.spoken.response_id != msg.response_id
        ):
            problem = f"response {msg.response_id[:64]!r} was not spoken: give heard_chars"
        if problem is not None:
            self._out.error("invalid_message", problem, in_reply_to=msg.id)
            return
        running = state.response is not None
        if running:
            self.cancel(msg.response_id, start_next=False)
        if msg.heard_chars is not None:
            heard = msg.heard_chars
            self._history.truncate_last_turn(heard)
        else:
            assert state.spoken is not None
            assert msg.audio_end_ms is not None
            heard = self.keep_heard(state.spoken, msg.audio_end_ms)
        self._out.send(
            ResponseTruncated(response_id=msg.response_id, heard_chars=heard, in_reply_to=msg.id)
        )
        if running and state.response is None:
            self.start_next()

    def keep_heard(self, spoken: SpokenAudio, played_ms: int) -> int:
        """Keep in the history the text the first ``played_ms`` of the latest response's
        audio said, cut back to the end of a word (a word half heard was not heard); the
        characters kept."""
        text = self._history.last_turn_text()
        heard = word_end(text, min(heard_chars(spoken, played_ms), len(text)))
        self._history.truncate_last_turn(heard)
        return heard

    def deliver(self, completion: Completion) -> None:
        """Give an async call's outcome to the model, as its ``delivery`` says."""
        call = completion.call
        note = ContextNote(text=completion.note, call_id=call.call_id)
        call.slim()  # the note has the outcome now
        self._state.notes.append(PendingNote(note=note, announce=call.delivery != "silent"))
        if call.delivery == "silent":
            return
        if call.delivery == "interrupt" and self._state.response is not None:
            self.cancel(None, start_next=False)
        if self._state.response is None:
            self._start_completion_response(call.call_id)
        # when_idle with a response running: the note joins its next model step.

    def _flush_notes(self) -> None:
        notes = self._state.notes
        self._history.extend([pending.note for pending in notes])
        notes.clear()

    # ----------------------------------------------------------------- model

    def on_model_event(self, step_id: str, event: ModelEvent, now: float) -> None:
        """Apply the output of model step ``step_id`` (dropped unless it is the running
        response's step)."""
        response = self._state.response
        if response is None or response.step_id != step_id:
            return  # output of a cancelled step: dropped, never sent
        match event:
            case ModelText(text=text) if text:
                self.on_text(response, text)
            case ModelToolCall():
                response.requested.append(event)
            case ModelFinish(usage=usage):
                if usage is not None:
                    response.usage.input_tokens += usage.input_tokens
                    response.usage.output_tokens += usage.output_tokens
                    response.usage.input_audio_tokens += usage.input_audio_tokens
                    response.usage.output_audio_tokens += usage.output_audio_tokens
                    response.usage.cached_input_tokens += usage.cached_input_tokens
                    _add_cost(response, usage.cost)
                self._finish_step(response, now)
            case ModelRetrying(attempt=attempt, delay=delay, reason=reason):
                self._out.send(
                    ResponseRetrying(
                        response_id=response.response_id,
                        attempt=attempt,
                        delay=round(delay, 3),
                        reason=reason,
                    )
                )

    def on_text(self, response: ResponseState, text: str) -> None:
        """A text delta (not empty) of ``response``'s streaming step."""
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
        for piece in segmenter.feed(seen_text(response)):
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
            segment = TextSegment(response_id=response.response_id, text=piece)
            self._out.send(segment)
            if response.spoken:
                self._out.do(Speak(response.response_id, segment.seq, piece))

    def _end_step_text(self, response: ResponseState, text: str) -> None:
        """The step's text is complete: its last segment (voice), then ``text.done``."""
        if response.voice and (rest := self._segmenter_for(response).flush()) is not None:
            self._send_segments(response, [rest])
        self._out.send(TextDone(response_id=response.response_id, text=text))

    def fail_running(self, message: str) -> None:
        """End the response running now, if any, saying why (``internal``, naming it and
        the message it answers): the core failed in the middle of it. Whatever the core
        raised, every ``response.created`` gets its ``response.done``, once."""
        response = self._state.response
        if response is None:
            return
        self._out.error(
            "internal",
            message,
            in_reply_to=response.in_reply_to,
            response_id=response.response_id,
        )
        status: ResponseStatus = "incomplete" if seen_text(response) else "failed"
        self.cancel(response.response_id, status=status, reason=message)

    def on_model_failed(self, event: ModelFailed) -> None:
        """Model step ``event.step_id`` failed: its response ends, saying why."""
        response = self._state.response
        if response is None or response.step_id != event.step_id:
            return
        seen = seen_text(response)
        streamed = bool(seen)
        if streamed:
            self._history.append(AssistantTurn(text=seen))
        response.step_id = None
        self._out.send(
            Error(
                code=event.code,
                message=event.message,
                retryable=event.retryable,
                response_id=response.response_id,
                retry_after=event.retry_after,
                limit=event.limit,
            )
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
        self._history.append(AssistantTurn(text=seen_text(response)))
        response.step_id = None
        self._out.error(
            "response_interrupted",
            "the gateway node running this response stopped, and the model's new attempt"
            " did not continue the text already sent",
            retryable=True,
            response_id=response.response_id,
        )
        self._end_response("incomplete")

    def _finish_step(self, response: ResponseState, now: float) -> None:
        if response.unconfirmed:  # the new attempt said less than the client has
            self._interrupted(response)
            return
        text = "".join(response.text)
        response.step_id = None
        max_steps = response.max_steps or self._terms.settings.limits.max_steps
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
            now=now,
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
        self.advance_if_step_settled()

    def advance_if_step_settled(self) -> None:
        """The running response's next step starts once no call of its last one blocks."""
        response = self._state.response
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


def _add_cost(response: ResponseState, cost: float | None) -> None:
    """Count a step's cost in its response's; one step of unknown cost makes the whole
    response's unknown (``null``, never a partial sum passed off as the total)."""
    if cost is None:
        response.cost_unknown = True
    else:
        response.usage.cost = round((response.usage.cost or 0.0) + cost, 9)


def seen_text(response: ResponseState) -> str:
    """The text of the current step the client has."""
    return "".join(response.text) + response.unconfirmed

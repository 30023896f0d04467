"""A session's responses: turns, model steps, cancellation, delivery of async results.

Part of the pure session core: it never awaits, reads a clock or touches a socket. One
response runs at a time, a model step after another until the model asks for no tool;
user messages that arrive meanwhile wait in a queue, and the outcomes of async calls wait
as notes for the next step (or start a response of their own). ``dispatch`` owns the tool
calls.

``Responses`` is the base of ``Session`` (``gateway.core.session``), which adds the
session's lifecycle, takes its events (``receive``) and saves and restores it as a value;
it is not used on its own. A base class rather than a member: every text delta of every
answer goes through here (``Session.model_text``, then ``_on_text``), and reaching a
member would cost each delta one more lookup.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.dispatch import Completion, Dispatcher
from gateway.core.event import CallModel, CancelModel, ModelFailed
from gateway.core.history import History
from gateway.core.inbound import ResponseStatus, UserMessage
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
    ResponseCreated,
    ResponseDone,
    ResponseRetrying,
    SessionEnded,
    TextDelta,
    TextDone,
    TextSegment,
)
from gateway.core.outbox import Outbox
from gateway.core.segments import DEFAULT_FIRST_MIN_CHARS, Segmenter
from gateway.core.settings import SessionSettings
from gateway.core.state import PendingNote, Phase, ResponseState
from gateway.core.tool_choice import refusal, step_choice
from gateway.core.toolset import Toolset
from gateway.core.transcript import CANCELLED, AssistantTurn, ContextNote, RequestedCall, UserTurn

__all__ = ["Responses", "seen_text"]


class Responses:
    """The responses of one session; see the module docstring."""

    def __init__(self, settings: SessionSettings, *, new_id: Callable[[str], str]) -> None:
        self._toolset = Toolset(settings, [])
        """The agent's tools (another agent's after a transfer) and the client's own."""
        self._instructions = settings.instructions
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
        self._response: ResponseState | None = None
        self._tool_choice = "auto"
        """The session's default ``tool_choice`` (``session.start``/``session.update``)."""
        self._max_steps: int | None = None
        """The session's default ``max_steps``; ``None``: the gateway's limit."""
        self._tool_mode = "auto"
        """The session's default tool mode: ``manual`` sends every tool call to the client."""
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

    @property
    def _settings(self) -> SessionSettings:
        """The settings of the agent the session is with (another after a transfer)."""
        return self._toolset.settings

    # ----------------------------------------------------------------- responses

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
            in_reply_to=msg.id,
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

    def _shut_down(self) -> None:
        response = self._response
        if response is not None and response.step_id is not None:
            self._out.do(CancelModel(response.step_id))
        self._calls.drop_all()
        self._response = None
        self._queue.clear()
        self._phase = Phase.CLOSED

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
            if seen := seen_text(response):
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
            self._out.send(TextSegment(response_id=response.response_id, text=piece))

    def _end_step_text(self, response: ResponseState, text: str) -> None:
        """The step's text is complete: its last segment (voice), then ``text.done``."""
        if response.voice and (rest := self._segmenter_for(response).flush()) is not None:
            self._send_segments(response, [rest])
        self._out.send(TextDone(response_id=response.response_id, text=text))

    def _fail_running(self, message: str) -> None:
        """End the response running now, if any, saying why (``internal``, naming it and
        the message it answers): the core failed in the middle of it. Whatever the core
        raised, every ``response.created`` gets its ``response.done``, once."""
        response = self._response
        if response is None:
            return
        self._out.error(
            "internal",
            message,
            in_reply_to=response.in_reply_to,
            response_id=response.response_id,
        )
        status: ResponseStatus = "incomplete" if seen_text(response) else "failed"
        self._cancel_response(response.response_id, status=status, reason=message)

    def _on_model_failed(self, event: ModelFailed) -> None:
        response = self._response
        if response is None or response.step_id != event.step_id:
            return
        seen = seen_text(response)
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


def seen_text(response: ResponseState) -> str:
    """The text of the current step the client has."""
    return "".join(response.text) + response.unconfirmed

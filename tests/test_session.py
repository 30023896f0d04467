"""The pure session core: events in, effects out. No asyncio, no sockets, no clock."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from gateway.core.call import Call, CallState, IllegalTransition, Ledger
from gateway.core.event import (
    CallModel,
    CancelModel,
    CancelTool,
    Disconnected,
    Effect,
    Event,
    ModelFailed,
    ModelOutput,
    RunTool,
    SaveCall,
    Send,
    Tick,
    ToolFinished,
    ToolProgress,
)
from gateway.core.model import ModelFinish, ModelRetrying, ModelText, ModelToolCall, ModelUsage
from gateway.core.principal import ANONYMOUS, Principal
from gateway.core.session import Session, SessionSettings
from gateway.core.state import decode_state, encode_state
from gateway.core.tool import ToolDef, ToolRegistry
from gateway.core.transcript import AssistantTurn, ContextNote, ToolOutcome, UserTurn
from gateway.wire.v1 import (
    DecodeFailure,
    Error,
    Limits,
    Ping,
    Pong,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    ResponseRetrying,
    ServerMsg,
    SessionCreated,
    SessionStart,
    SessionUpdate,
    SessionUpdated,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolSpec,
    ToolStatus,
    UserMessage,
)

LIMITS = Limits(
    max_message_chars=100,
    max_queued_messages=2,
    max_steps=3,
    ws_max_size=2**16,
    client_call_timeout=10.0,
)

TOOLS = ToolRegistry(
    [
        ToolDef(
            name="lamp",
            description="Switch the lamp.",
            kind="client",
            input_schema={
                "type": "object",
                "properties": {"on": {"type": "boolean"}},
                "required": ["on"],
            },
            output_schema={"type": "object", "required": ["ok"]},
        ),
        ToolDef(
            name="weather",
            description="Weather.",
            kind="server",
            input_schema={"type": "object"},
            timeout=2.0,
        ),
        *(
            ToolDef(
                name=name,
                description="Track a parcel.",
                kind="server",
                input_schema={"type": "object"},
                timeout=60.0,
                execution="async",
                delivery=delivery,
            )
            for name, delivery in (
                ("track", "when_idle"),
                ("track_now", "interrupt"),
                ("track_quietly", "silent"),
            )
        ),
    ]
)


class Harness:
    """Drives a Session the way the driver does, and records what it sends.

    With ``round_trip`` (every test runs both ways, see ``persisted``), the session is
    persisted and restored after every event, as a store and another node would: each
    test then checks that a restored session carries on exactly like the original.
    """

    round_trip = False

    def __init__(
        self,
        *,
        model_supports_tools: bool = True,
        principal: Principal = ANONYMOUS,
        limits: Limits = LIMITS,
        **settings: Any,
    ) -> None:
        counter = itertools.count(1)
        self.settings = SessionSettings(
            agent="test",
            instructions="be nice",
            tools=TOOLS,
            model_supports_tools=model_supports_tools,
            limits=limits,
            server_tool_timeout=5.0,
            principal=principal,
            **settings,
        )
        self.new_id = lambda prefix: f"{prefix}_{next(counter)}"
        self.session = Session(
            self.settings, session_id="sess_1", resume_token="token", new_id=self.new_id
        )
        self.now = 1000.0
        self.sent: list[ServerMsg] = []
        self.other: list[Effect] = []
        self.saved: list[Call] = []

    def feed(self, event: Event) -> list[ServerMsg]:
        self.session.receive(event, now=self.now)
        sent = []
        for effect in self.session.effects():
            if isinstance(effect, Send):
                sent.append(effect.msg)
            elif isinstance(effect, SaveCall):
                self.saved.append(msgspec.structs.replace(effect.call))
            else:
                self.other.append(effect)
        self.sent += sent
        if self.round_trip:
            state = decode_state(encode_state(self.session.state()))
            self.session = Session.restore(self.settings, state, new_id=self.new_id)
        return sent

    def start(self, **kwargs: Any) -> SessionCreated:
        (created,) = self.feed(SessionStart(**kwargs))
        assert isinstance(created, SessionCreated)
        return created

    def last_model_call(self) -> CallModel:
        return [e for e in self.other if isinstance(e, CallModel)][-1]

    def model(self, *events: Any) -> list[ServerMsg]:
        step = self.last_model_call().step_id
        out: list[ServerMsg] = []
        for event in events:
            out += self.feed(ModelOutput(step, event))
        return out


@pytest.fixture(autouse=True, params=["live", "persisted"])
def persisted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test on a live session, and on one persisted and restored at every step."""
    monkeypatch.setattr(Harness, "round_trip", request.param == "persisted")


def lamp_call(on: Any = True) -> ModelToolCall:
    return ModelToolCall(name="lamp", args={"on": on})


def test_seq_starts_at_one_and_increases_across_turns():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hi"))
    h.model(ModelText("Hel"), ModelText("lo"), ModelFinish())
    h.feed(Ping(ts=1.5))
    assert [m.seq for m in h.sent] == list(range(1, len(h.sent) + 1))
    assert isinstance(h.sent[-1], Pong)
    assert h.sent[-1].ts == 1.5


def test_text_streams_then_done_then_response_done_with_usage():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hi", id="m1"))
    sent = h.model(
        ModelText("Hel"),
        ModelText("lo"),
        ModelFinish(usage=ModelUsage(input_tokens=3, output_tokens=2)),
    )
    assert [type(m) for m in sent] == [TextDelta, TextDelta, TextDone, ResponseDone]
    done = sent[-1]
    assert isinstance(done, ResponseDone)
    assert done.usage is not None
    assert (done.status, done.usage.input_tokens, done.usage.output_tokens) == ("completed", 3, 2)
    request = h.last_model_call().request
    assert request.items == (UserTurn(text="hi"),)
    assert request.instructions == "be nice"
    assert [t.name for t in request.tools] == [d.name for d in TOOLS.definitions()]


def test_message_before_start_and_second_start_are_errors():
    h = Harness()
    (error,) = h.feed(UserMessage(text="hi", id="x"))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to) == ("invalid_message", "x")
    h.start()
    (error,) = h.feed(SessionStart(id="again"))
    assert isinstance(error, Error)
    assert "already" in error.message


def test_decode_failure_becomes_an_error_event():
    h = Harness()
    (error,) = h.feed(DecodeFailure(code="unknown_type", message="nope", in_reply_to="z"))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to) == ("unknown_type", "z")


def test_client_functions_declared_at_start_join_the_tools():
    h = Harness()
    created = h.start(
        client_functions=[ToolSpec(name="vibrate", description="Vibrate the phone.", timeout=3)]
    )
    assert [(t.name, t.kind) for t in created.tools] == [
        *((d.name, d.kind) for d in TOOLS.definitions()),
        ("vibrate", "client"),
    ]


def test_client_functions_the_principal_may_not_declare_are_forbidden():
    h = Harness(
        principal=Principal(
            name="key:k", kind="client_token", client_functions=frozenset({"vibrate"})
        )
    )
    beep = ToolSpec(name="beep", description="Beep.")
    vibrate = ToolSpec(name="vibrate", description="Vibrate the phone.")
    (error,) = h.feed(SessionStart(id="s", client_functions=[vibrate, beep]))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to) == ("forbidden", "s")
    assert "'beep'" in error.message
    assert not h.session.started
    # The agent's own client functions (lamp) are always allowed: declaring them adds nothing.
    lamp = ToolSpec(name="lamp", description="Switch the lamp.")
    created = h.start(client_functions=[vibrate, lamp])
    assert {"vibrate", "lamp"} <= {t.name for t in created.tools}
    (error,) = h.feed(SessionUpdate(id="u", client_functions=[beep]))
    assert isinstance(error, Error)
    assert error.code == "forbidden"
    assert h.session.principal.name == "key:k"


def test_model_without_tool_support_refuses_a_session_with_tools():
    h = Harness(model_supports_tools=False)
    (error,) = h.feed(SessionStart(id="s"))
    assert isinstance(error, Error)
    assert "cannot call tools" in error.message


def test_client_call_round_trip_feeds_the_outcome_to_the_next_step():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp on"))
    (batch,) = h.model(lamp_call(), ModelFinish())
    assert isinstance(batch, ToolCalls)
    (call,) = batch.calls
    assert (call.deadline, call.timeout) == (1010.0, 10.0)
    assert h.session.next_deadline() == 1010.0
    (status,) = h.feed(
        ToolResults(results=[ToolResult(call_id=call.call_id, tool="lamp", output={"ok": 1})])
    )
    assert isinstance(status, ToolStatus)
    assert status.status == "completed"
    items = h.last_model_call().request.items
    assert items[-2:] == (
        AssistantTurn(text="", calls=items[-2].calls),  # type: ignore[union-attr]
        ToolOutcome(call_id=call.call_id, name="lamp", output={"ok": 1}),
    )
    assert h.session.next_deadline() is None


def test_expired_call_gives_expired_status_and_an_error_to_the_model():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp on"))
    (batch,) = h.model(lamp_call(), ModelFinish())
    assert isinstance(batch, ToolCalls)
    h.now = 1009.9
    assert h.feed(Tick()) == []
    h.now = 1010.0
    (status,) = h.feed(Tick())
    assert isinstance(status, ToolStatus)
    assert status.status == "expired"
    outcome = h.last_model_call().request.items[-1]
    assert isinstance(outcome, ToolOutcome)
    assert outcome.error is not None


def test_invalid_arguments_fail_the_call_without_asking_the_client():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp"))
    sent = h.model(lamp_call(on="yes please"), ModelFinish())
    assert [type(m) for m in sent] == [ToolStatus]
    assert isinstance(sent[0], ToolStatus)
    assert sent[0].status == "failed"
    assert "invalid arguments" in (sent[0].error or "")
    assert h.last_model_call().request.items[-1] == ToolOutcome(
        call_id=sent[0].call_id, name="lamp", error=sent[0].error
    )


def test_unknown_tool_from_the_model_fails_the_call():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="x"))
    (status,) = h.model(ModelToolCall(name="teleport", args={}), ModelFinish())
    assert isinstance(status, ToolStatus)
    assert status.error == "unknown tool 'teleport'"


def test_server_tool_runs_and_times_out_with_a_cancel():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="weather"))
    (running,) = h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    assert isinstance(running, ToolStatus)
    assert running.status == "running"
    run = [e for e in h.other if isinstance(e, RunTool)][-1]
    assert h.session.next_deadline() == 1002.0
    h.now = 1002.0
    (failed,) = h.feed(Tick())
    assert isinstance(failed, ToolStatus)
    assert failed.status == "failed"
    assert CancelTool(run.call_id) in h.other
    # The tool's return after its timeout is ignored.
    assert h.feed(ToolFinished(call_id=run.call_id, output={"sunny": True})) == []


def test_duplicate_result_repeats_the_stored_status():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp"))
    (batch,) = h.model(lamp_call(), ModelFinish())
    assert isinstance(batch, ToolCalls)
    result = ToolResults(
        results=[ToolResult(call_id=batch.calls[0].call_id, tool="lamp", output={"ok": 1})]
    )
    h.feed(result)
    steps_before = len([e for e in h.other if isinstance(e, CallModel)])
    (dup,) = h.feed(result)
    assert isinstance(dup, ToolStatus)
    assert (dup.status, dup.duplicate) == ("completed", True)
    assert len([e for e in h.other if isinstance(e, CallModel)]) == steps_before


def test_cancel_stops_the_model_and_cancels_open_calls():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp"))
    running, batch = h.model(lamp_call(), ModelToolCall(name="weather", args={}), ModelFinish())
    assert isinstance(running, ToolStatus)
    assert running.status == "running"
    assert isinstance(batch, ToolCalls)
    assert [c.tool for c in batch.calls] == ["lamp"]
    sent = h.feed(ResponseCancel())
    assert [m.status for m in sent if isinstance(m, ToolStatus)] == ["cancelled", "cancelled"]
    assert isinstance(sent[-1], ResponseDone)
    assert sent[-1].status == "cancelled"
    assert any(isinstance(e, CancelTool) for e in h.other)


def test_cancel_mid_stream_drops_later_deltas():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="talk"))
    step = h.last_model_call().step_id
    h.model(ModelText("one "))
    (done,) = h.feed(ResponseCancel())
    assert isinstance(done, ResponseDone)
    assert done.status == "cancelled"
    assert CancelModel(step) in h.other
    assert h.feed(ModelOutput(step, ModelText("two"))) == []
    assert h.feed(ModelOutput(step, ModelFinish())) == []


def test_cancel_with_nothing_running_or_another_id_does_nothing():
    h = Harness()
    h.start()
    assert h.feed(ResponseCancel()) == []
    h.feed(UserMessage(text="x"))
    assert h.feed(ResponseCancel(response_id="resp_other")) == []


def test_messages_queue_behind_a_response_up_to_the_limit():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="first"))
    assert h.feed(UserMessage(text="second")) == []
    assert h.feed(UserMessage(text="third")) == []
    (busy,) = h.feed(UserMessage(text="fourth", id="4"))
    assert isinstance(busy, Error)
    assert (busy.code, busy.in_reply_to, busy.retryable) == ("busy", "4", True)
    sent = h.model(ModelText("ok"), ModelFinish())
    assert isinstance(sent[-2], ResponseDone)
    assert isinstance(sent[-1], ResponseCreated)
    assert h.last_model_call().request.items[-1] == UserTurn(text="second")


def test_max_steps_ends_the_response_incomplete_without_running_the_last_calls():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="loop"))
    for _ in range(LIMITS.max_steps - 1):
        h.model(ModelToolCall(name="weather", args={}), ModelFinish())
        run = [e for e in h.other if isinstance(e, RunTool)][-1]
        h.feed(ToolFinished(call_id=run.call_id, output={}))
    runs_before = len([e for e in h.other if isinstance(e, RunTool)])
    sent = h.model(ModelText("again"), ModelToolCall(name="weather", args={}), ModelFinish())
    assert [type(m) for m in sent] == [TextDelta, TextDone, Error, ResponseDone]
    error, done = sent[2], sent[3]
    assert isinstance(error, Error)
    assert (error.code, error.response_id) == ("max_steps_exceeded", done.response_id)  # type: ignore[union-attr]
    assert isinstance(done, ResponseDone)
    assert done.status == "incomplete"
    assert len([e for e in h.other if isinstance(e, RunTool)]) == runs_before
    assert h.session.next_deadline() is None


def test_model_failure_fails_the_response_but_not_the_session():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="x"))
    step = h.last_model_call().step_id
    error, done = h.feed(ModelFailed(step, "boom"))
    assert isinstance(error, Error)
    assert (error.code, error.retryable) == ("provider_error", True)
    assert isinstance(done, ResponseDone)
    assert done.status == "failed"
    h.feed(UserMessage(text="again"))
    assert isinstance(h.model(ModelText("fine"), ModelFinish())[-1], ResponseDone)


def test_a_retry_before_any_output_is_told_to_the_client_and_the_turn_goes_on():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="x"))
    (notice,) = h.model(ModelRetrying(attempt=1, delay=0.4567, reason="HTTP 503"))
    assert isinstance(notice, ResponseRetrying)
    assert (notice.attempt, notice.delay, notice.reason) == (1, 0.457, "HTTP 503")
    sent = h.model(ModelText("fine"), ModelFinish())
    assert [type(m) for m in sent] == [TextDelta, TextDone, ResponseDone]
    assert {m.response_id for m in (notice, *sent)} == {notice.response_id}  # type: ignore[union-attr]


def test_disconnect_cancels_everything_and_closes():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="weather"))
    h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    assert h.feed(Disconnected()) == []
    assert h.session.closed
    assert h.session.next_deadline() is None
    assert any(isinstance(e, CancelTool) for e in h.other)
    assert h.feed(UserMessage(text="ignored")) == []


def test_call_lifecycle_refuses_a_second_settlement():
    call = Call(
        call_id="c", tool="t", display_name="T", kind="client", args={}, response_id="r", deadline=1
    )
    call.advance(CallState.COMPLETED)
    assert call.settled
    with pytest.raises(IllegalTransition):
        call.advance(CallState.FAILED)


def start_async(h: Harness, tool: str = "track") -> str:
    """Ask for an async call in a response that then ends; return the call id."""
    h.feed(UserMessage(text="where is it"))
    sent = h.model(ModelToolCall(name=tool, args={}), ModelFinish())
    (pending,) = sent
    assert isinstance(pending, ToolStatus)
    assert pending.status == "pending"
    # The model got PENDING at once and its next step already started.
    assert h.last_model_call().request.items[-1] == ToolOutcome(
        call_id=pending.call_id, name=tool, output={"status": "pending"}
    )
    done = h.model(ModelText("looking"), ModelFinish())[-1]
    assert isinstance(done, ResponseDone)
    return pending.call_id


NOTE = '<context>function [{}] completed with response {{"at":"depot"}}</context>'


def test_async_result_when_idle_starts_a_response_with_the_context():
    h = Harness()
    h.start()
    call_id = start_async(h)
    completed, created = h.feed(ToolFinished(call_id=call_id, output={"at": "depot"}))
    assert isinstance(completed, ToolStatus)
    assert (completed.status, completed.result) == ("completed", {"at": "depot"})
    assert isinstance(created, ResponseCreated)
    assert created.call_id == call_id
    assert h.last_model_call().request.items[-1] == ContextNote(
        text=NOTE.format("track"), call_id=call_id
    )


def test_async_result_when_busy_joins_the_next_step_of_the_running_response():
    h = Harness()
    h.start()
    call_id = start_async(h)
    h.feed(UserMessage(text="lamp"))
    (batch,) = h.model(lamp_call(), ModelFinish())
    assert isinstance(batch, ToolCalls)
    (completed,) = h.feed(ToolFinished(call_id=call_id, output={"at": "depot"}))
    assert isinstance(completed, ToolStatus)
    lamp = batch.calls[0]
    h.feed(ToolResults(results=[ToolResult(call_id=lamp.call_id, tool="lamp", output={"ok": 1})]))
    items = h.last_model_call().request.items
    assert isinstance(items[-2], ToolOutcome)
    assert items[-1] == ContextNote(text=NOTE.format("track"), call_id=call_id)


def test_async_result_with_interrupt_cancels_the_running_response():
    h = Harness()
    h.start()
    call_id = start_async(h, "track_now")
    h.feed(UserMessage(text="talk"))
    h.model(ModelText("blah "))
    running = h.last_model_call()
    sent = h.feed(ToolFinished(call_id=call_id, output={"at": "depot"}))
    assert [type(m) for m in sent] == [ToolStatus, ResponseDone, ResponseCreated]
    assert isinstance(sent[1], ResponseDone)
    assert (sent[1].response_id, sent[1].status) == (running.response_id, "cancelled")
    assert CancelModel(running.step_id) in h.other


def test_silent_async_result_waits_for_the_next_model_call():
    h = Harness()
    h.start()
    call_id = start_async(h, "track_quietly")
    (completed,) = h.feed(ToolFinished(call_id=call_id, output={"at": "depot"}))
    assert isinstance(completed, ToolStatus)
    h.feed(UserMessage(text="and now?"))
    items = h.last_model_call().request.items
    assert items[-2:] == (
        ContextNote(text=NOTE.format("track_quietly"), call_id=call_id),
        UserTurn(text="and now?"),
    )


def test_async_progress_and_timeout():
    h = Harness()
    h.start()
    call_id = start_async(h)
    (progress,) = h.feed(ToolProgress(call_id=call_id, payload={"pct": 50}))
    assert isinstance(progress, ToolStatus)
    assert (progress.status, progress.progress) == ("progress", {"pct": 50})
    assert h.session.next_deadline() == 1060.0
    h.now = 1060.0
    failed, created = h.feed(Tick())
    assert isinstance(failed, ToolStatus)
    assert failed.status == "failed"
    assert CancelTool(call_id) in h.other
    assert isinstance(created, ResponseCreated)
    note = h.last_model_call().request.items[-1]
    assert isinstance(note, ContextNote)
    assert "failed with error" in note.text
    assert "tool_timeout" in note.text


def test_cancel_leaves_a_pending_async_call_running():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="x"))
    pending, batch = h.model(ModelToolCall(name="track", args={}), lamp_call(), ModelFinish())
    assert isinstance(pending, ToolStatus)
    assert isinstance(batch, ToolCalls)
    sent = h.feed(ResponseCancel())
    assert [m.call_id for m in sent if isinstance(m, ToolStatus)] == [batch.calls[0].call_id]
    assert CancelTool(pending.call_id) not in h.other
    assert h.session.next_deadline() == 1060.0


def test_ledger_forgets_the_oldest_settled_calls_past_its_bound():
    ledger = Ledger(max_calls=2)
    calls = [
        Call(
            call_id=f"c{i}",
            tool="t",
            display_name="T",
            kind="client",
            args={},
            response_id="r",
            deadline=1,
        )
        for i in range(4)
    ]
    for call in calls[:3]:
        ledger.add(call)
    calls[0].advance(CallState.COMPLETED)
    ledger.add(calls[3])
    assert ledger.get("c0") is None  # settled and oldest: forgotten
    assert [c.call_id for c in ledger.open_calls()] == ["c1", "c2", "c3"]  # open: always kept


def test_session_update_replaces_the_client_functions():
    h = Harness()
    h.start(client_functions=[ToolSpec(name="vibrate", description="Vibrate.")])
    (updated,) = h.feed(
        SessionUpdate(id="u", client_functions=[ToolSpec(name="beep", description="Beep.")])
    )
    assert isinstance(updated, SessionUpdated)
    assert updated.in_reply_to == "u"
    names = [t.name for t in updated.tools]
    assert "beep" in names
    assert "vibrate" not in names
    (error,) = h.feed(
        SessionUpdate(client_functions=[ToolSpec(name="weather", description="Clash.")])
    )
    assert isinstance(error, Error)
    assert "defined twice" in error.message


def test_a_user_message_id_counts_once():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hi", id="m1"))
    h.model(ModelText("hello"), ModelFinish())
    assert h.feed(UserMessage(text="hi", id="m1")) == []  # resent after a drop: ignored
    (created,) = h.feed(UserMessage(text="hi again", id="m2"))
    assert isinstance(created, ResponseCreated)


def test_a_message_refused_as_busy_can_be_sent_again_with_its_id():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="first"))
    h.feed(UserMessage(text="q1"))
    h.feed(UserMessage(text="q2"))
    (busy,) = h.feed(UserMessage(text="later", id="m9"))
    assert isinstance(busy, Error)
    assert busy.code == "busy"
    h.model(ModelText("ok"), ModelFinish())  # first done: q1 starts, one queue place frees
    assert h.feed(UserMessage(text="later", id="m9")) == []  # queued this time
    h.model(ModelText("ok"), ModelFinish())
    h.model(ModelText("ok"), ModelFinish())
    assert h.last_model_call().request.items[-1] == UserTurn(text="later")

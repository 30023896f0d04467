"""tool_choice, per-message tools and max_steps in the pure session core: checked when the
client asks, carried in the model request of each step, enforced on the model's calls, and
kept across a persist/restore (every test runs both ways, see tests/test_session.py)."""

from __future__ import annotations

import dataclasses

from gateway.core.event import RunTool, ToolFinished
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.session import Session
from gateway.core.tool import ToolRegistry
from gateway.core.transcript import ToolOutcome
from gateway.wire.v1 import (
    Error,
    ResponseDone,
    SessionStart,
    SessionUpdate,
    SessionUpdated,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolRun,
    ToolSpec,
    ToolStatus,
    UserMessage,
)
from tests.test_session import LIMITS, Harness, lamp_call, persisted  # noqa: F401


def errors(sent: list[object]) -> list[str]:
    return [m.message for m in sent if isinstance(m, Error)]


def test_a_forced_tool_choice_holds_for_the_first_step_only():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="weather please", tool_choice="weather"))
    assert h.last_model_call().request.tool_choice == "weather"
    h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    run = [e for e in h.other if isinstance(e, RunTool)][-1]
    h.feed(ToolFinished(call_id=run.call_id, output={"sky": "blue"}))
    # The step that sees the result is the model's to decide: no loop of forced calls.
    assert h.last_model_call().request.tool_choice == "auto"


def test_the_session_default_applies_until_a_message_or_an_update_says_otherwise():
    h = Harness()
    h.start(tool_choice="required", max_steps=2)
    h.feed(UserMessage(text="one"))
    assert h.last_model_call().request.tool_choice == "required"
    h.model(ModelText("ok"), ModelFinish())
    h.feed(UserMessage(text="two", tool_choice="none"))
    assert h.last_model_call().request.tool_choice == "none"
    h.model(ModelText("ok"), ModelFinish())
    (updated,) = h.feed(SessionUpdate(tool_choice="auto"))
    assert isinstance(updated, SessionUpdated)
    h.feed(UserMessage(text="three"))
    assert h.last_model_call().request.tool_choice == "auto"


def test_per_message_tools_narrow_what_the_model_sees_and_may_call():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp only", tools=["lamp"]))
    assert [t.name for t in h.last_model_call().request.tools] == ["lamp"]
    sent = h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    (refused,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert (refused.tool, refused.status) == ("weather", "failed")
    assert refused.error == "tool 'weather' is not offered for this response"
    assert not [e for e in h.other if isinstance(e, RunTool)]  # nothing ran
    outcome = h.last_model_call().request.items[-1]
    assert isinstance(outcome, ToolOutcome)
    assert outcome.error == refused.error  # the model sees why, and answers
    h.model(ModelText("sorry"), ModelFinish())
    h.feed(UserMessage(text="all again"))
    assert len(h.last_model_call().request.tools) > 1


def test_a_tool_called_while_tools_are_off_is_refused():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="no tools", tool_choice="none"))
    sent = h.model(lamp_call(), ModelFinish())
    (refused,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert refused.status == "failed"
    assert refused.error is not None
    assert "tools are off" in refused.error


def test_a_message_max_steps_ends_its_response_sooner():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="once", max_steps=1))
    sent = h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    assert [m.code for m in sent if isinstance(m, Error)] == ["max_steps_exceeded"]
    done = sent[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "incomplete"


def test_what_cannot_be_honoured_is_refused_with_a_clear_error():
    h = Harness()
    h.start()
    cases = [
        (UserMessage(text="x", tool_choice="teleport"), "neither auto, none, required"),
        (UserMessage(text="x", tools=["lamp", "teleport"]), "does not offer: 'teleport'"),
        (UserMessage(text="x", tools=["lamp"], tool_choice="weather"), "tool_choice 'weather'"),
        (UserMessage(text="x", tools=[], tool_choice="required"), "no tool is offered"),
        (UserMessage(text="x", max_steps=LIMITS.max_steps + 1), "over this gateway's limit"),
        (SessionUpdate(tool_choice="teleport"), "neither auto, none, required"),
    ]
    for msg, words in cases:
        sent = h.feed(msg)
        assert len(sent) == 1, msg
        assert words in errors(sent)[0], msg
    assert not h.other  # no model was called


def test_a_session_start_that_cannot_be_honoured_gets_an_error_not_a_session():
    h = Harness()
    (refused,) = h.feed(SessionStart(tool_choice="teleport"))
    assert isinstance(refused, Error)
    assert "teleport" in refused.message
    h.start()  # the session can still start


def test_a_model_without_tool_choice_support_refuses_a_forced_choice():
    h = Harness(model_supports_tool_choice=False)
    h.start()
    (refused,) = h.feed(UserMessage(text="x", tool_choice="required"))
    assert isinstance(refused, Error)
    assert "does not take a tool_choice" in refused.message
    h.feed(UserMessage(text="x", tool_choice="auto"))
    assert h.last_model_call().request.tool_choice == "auto"


def test_manual_mode_offers_a_server_tool_to_the_client_and_runs_nothing():
    h = Harness()
    h.start(tool_mode="manual")
    h.feed(UserMessage(text="weather and lamp"))
    sent = h.model(ModelToolCall(name="weather", args={}), lamp_call(), ModelFinish())
    (batch,) = [m for m in sent if isinstance(m, ToolCalls)]
    assert [(c.tool, c.kind) for c in batch.calls] == [("weather", "server"), ("lamp", "client")]
    assert not [e for e in h.other if isinstance(e, RunTool)]
    weather, lamp = batch.calls
    h.feed(
        ToolResults(
            results=[
                ToolResult(call_id=weather.call_id, tool="weather", output={"sky": "grey"}),
                ToolResult(call_id=lamp.call_id, tool="lamp", output={"ok": True}),
            ]
        )
    )
    items = h.last_model_call().request.items
    assert [i.output for i in items if isinstance(i, ToolOutcome)] == [
        {"sky": "grey"},
        {"ok": True},
    ]


def test_manual_mode_the_client_may_have_the_gateway_run_a_server_tool_once():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="weather", tool_mode="manual"))
    (batch,) = [
        m
        for m in h.model(ModelToolCall(name="weather", args={}), ModelFinish())
        if isinstance(m, ToolCalls)
    ]
    (call,) = batch.calls
    (running,) = h.feed(ToolRun(call_id=call.call_id, args={"city": "Oslo"}))
    assert isinstance(running, ToolStatus)
    assert running.status == "running"
    (run,) = [e for e in h.other if isinstance(e, RunTool)]
    assert run.args == {"city": "Oslo"}  # the client's edit
    (again,) = h.feed(ToolRun(call_id=call.call_id))
    assert isinstance(again, ToolStatus)
    assert again.duplicate
    h.feed(ToolFinished(call_id=run.call_id, output={"sky": "blue"}))
    outcome = h.last_model_call().request.items[-1]
    assert isinstance(outcome, ToolOutcome)
    assert outcome.output == {"sky": "blue"}
    # The next message's response is back to auto: the gateway runs the tool itself.
    h.model(ModelText("ok"), ModelFinish())
    h.feed(UserMessage(text="weather again"))
    h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    assert len([e for e in h.other if isinstance(e, RunTool)]) == 2


def test_a_bad_tool_run_gets_an_error_and_the_call_stays_the_clients():
    h = Harness()
    h.start(tool_mode="manual")
    h.feed(UserMessage(text="lamp"))
    (batch,) = [m for m in h.model(lamp_call(), ModelFinish()) if isinstance(m, ToolCalls)]
    (lamp,) = batch.calls
    (refused,) = h.feed(ToolRun(call_id=lamp.call_id))  # a client function: not the gateway's
    assert isinstance(refused, Error)
    assert refused.code == "unknown_call"
    h.feed(UserMessage(text="x"))  # queued behind the response
    h.feed(ToolResults(results=[ToolResult(call_id=lamp.call_id, tool="lamp", output={"ok": 1})]))
    assert isinstance(h.last_model_call().request.items[-1], ToolOutcome)


def test_a_model_that_cannot_call_tools_refuses_client_functions_added_by_an_update():
    h = Harness(model_supports_tools=False)
    h.settings = dataclasses.replace(h.settings, tools=ToolRegistry())
    h.session = Session(h.settings, session_id="sess_1", resume_token="t", new_id=h.new_id)
    h.start()  # no tools: the session starts
    (refused,) = h.feed(
        SessionUpdate(client_functions=[ToolSpec(name="vibrate", description="Vibrate.")])
    )
    assert isinstance(refused, Error)
    assert refused.message == "this agent's model cannot call tools"
    (refused,) = h.feed(UserMessage(text="x", tool_choice="required"))
    assert isinstance(refused, Error)
    assert "cannot call tools" in refused.message

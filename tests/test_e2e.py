"""End to end: uvicorn on port 0, the real client connection, real sockets."""

from __future__ import annotations

import pytest

from gateway.wire.v1 import (
    Error,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.data import tools as test_tools
from tests.support import (
    running_gateway,
    say,
    say_until_calls,
    session,
    streamed_text,
    types,
)


@pytest.fixture
async def url():
    async with running_gateway() as gateway_url:
        yield gateway_url


@pytest.fixture
async def demo_url():
    async with running_gateway(agent=None, scripted_pace=0.0) as gateway_url:
        yield gateway_url


def _answer(calls: ToolCalls, tool: str, **output: object) -> ToolResult:
    call = next(c for c in calls.calls if c.tool == tool)
    return ToolResult(call_id=call.call_id, tool=call.tool, output=output)


async def test_text_streams_in_order_with_increasing_seq(url):
    async with session(url) as (conn, created):
        events = await say(conn, "echo the quick brown fox", msg_id="m1")
    assert (created.seq, created.protocol_version) == (1, 1)
    assert types(events) == [
        "response.created",
        *["text.delta"] * 4,
        "text.done",
        "response.done",
    ]
    assert [e.seq for e in events] == list(range(2, 2 + len(events)))
    created_event, done_text, done = events[0], events[-2], events[-1]
    assert isinstance(created_event, ResponseCreated)
    assert created_event.in_reply_to == "m1"
    assert isinstance(done_text, TextDone)
    assert done_text.text == "the quick brown fox"
    assert streamed_text(events) == "the quick brown fox"
    assert isinstance(done, ResponseDone)
    assert (done.status, done.turn_completed) == ("completed", True)
    assert done.usage is not None
    assert done.usage.output_tokens == 4
    assert {e.response_id for e in events if isinstance(e, TextDelta)} == {done.response_id}


async def test_demo_battery_round_trip_feeds_the_result_to_the_model(demo_url):
    async with session(demo_url) as (conn, created):
        assert {t.name for t in created.tools} >= {
            "open_settings",
            "get_battery_level",
            "get_nearest_store",
            "check_stock",
        }
        calls = await say_until_calls(conn, "what's my battery level?")
        (call,) = calls.calls
        assert (call.tool, call.display_name, call.args) == (
            "get_battery_level",
            "Battery level",
            {},
        )
        assert call.call_id.startswith("call_")
        assert len(call.call_id) > 20
        assert call.timeout == 15.0
        await conn.send(ToolResults(results=[_answer(calls, "get_battery_level", level=0.82)]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    status = events[0]
    assert isinstance(status, ToolStatus)
    assert (status.call_id, status.status, status.duplicate) == (call.call_id, "completed", False)
    assert streamed_text(events) == "Your battery is at 82%."
    assert isinstance(events[-1], ResponseDone)
    assert events[-1].status == "completed"


async def test_demo_nearest_store_passes_the_zip_code(demo_url):
    async with session(demo_url) as (conn, _):
        calls = await say_until_calls(conn, "nearest store to 92031 please")
        assert calls.calls[0].args == {"zip_code": "92031"}
        result = _answer(calls, "get_nearest_store", name="Vista", address="1 Main St")
        await conn.send(ToolResults(results=[result]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "The nearest store to 92031 is Vista, 1 Main St."


async def test_demo_server_tool_runs_in_the_turn(demo_url):
    async with session(demo_url) as (conn, _):
        events = await say(conn, "do you have headphones in stock?")
    statuses = [e for e in events if isinstance(e, ToolStatus)]
    assert [s.status for s in statuses] == ["running", "completed"]
    assert statuses[1].result == {
        "product": "headphones",
        "in_stock": True,
        "quantity": 8,
        "price": 129.0,
    }
    assert streamed_text(events) == "Good news: we have 8 headphones in stock, at $129.00 each."


async def test_two_parallel_calls_answered_in_reverse_order(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "two")
        assert [c.tool for c in calls.calls] == ["device_a", "device_b"]
        await conn.send(ToolResults(results=[_answer(calls, "device_b", value="bee")]))
        first = await conn.recv()
        assert isinstance(first, ToolStatus)
        assert first.tool == "device_b"
        await conn.send(ToolResults(results=[_answer(calls, "device_a", value="ay")]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert types(events)[0] == "tool.status"
    # The model's next step sees the results in call order, not arrival order.
    assert streamed_text(events) == "A=ay B=bee"
    assert len([e for e in events if isinstance(e, TextDone)]) == 1


async def test_unanswered_call_expires_and_the_model_gets_an_error(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "slow")
        (call,) = calls.calls
        assert 0 < call.timeout <= 0.3
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone), within=5)
        expired = events[0]
        assert isinstance(expired, ToolStatus)
        assert expired.status == "expired"
        assert streamed_text(events) == "slow failed: the client did not answer in time"
        # A result after expiry is confirmed with the stored outcome, never applied.
        await conn.send(
            ToolResults(results=[ToolResult(call_id=call.call_id, tool=call.tool, output={})])
        )
        late = await conn.recv()
    assert isinstance(late, ToolStatus)
    assert (late.status, late.duplicate) == ("expired", True)


async def test_cancel_with_an_open_call_cancels_it_and_drops_its_late_result(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "one")
        await conn.send(ResponseCancel(response_id=calls.response_id))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert types(events) == ["tool.status", "response.done"]
        assert isinstance(events[0], ToolStatus)
        assert events[0].status == "cancelled"
        assert isinstance(events[1], ResponseDone)
        assert events[1].status == "cancelled"
        assert events[1].turn_completed is False
        await conn.send(ToolResults(results=[_answer(calls, "device_a", value="late")]))
        late = await conn.recv()
        assert isinstance(late, ToolStatus)
        assert (late.status, late.duplicate) == ("cancelled", True)
        # The session goes on, and the late result never reached the model.
        after = await say(conn, "echo still here")
    assert streamed_text(after) == "still here"


async def test_cancel_during_streaming_stops_the_deltas(url):
    async with session(url) as (conn, _):
        await conn.send(UserMessage(text="slowtext"))
        await conn.recv_until(lambda e: isinstance(e, TextDelta))
        await conn.send(ResponseCancel())
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.status == "cancelled"
        assert "text.done" not in types(events)
        # Nothing of the cancelled response arrives after its response.done.
        after = await say(conn, "echo next")
    assert types(after)[0] == "response.created"
    assert all(getattr(e, "response_id", None) != done.response_id for e in after)
    assert streamed_text(after) == "next"


async def test_duplicate_result_is_confirmed_but_reaches_the_model_once(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "one")
        result = _answer(calls, "device_a", value="x")
        await conn.send(ToolResults(results=[result]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        await conn.send(ToolResults(results=[result]))
        dup = await conn.recv()
        after = await say(conn, "echo ok")
    assert isinstance(dup, ToolStatus)
    assert (dup.call_id, dup.status, dup.duplicate) == (result.call_id, "completed", True)
    assert streamed_text(events) == "A=x"
    assert streamed_text(after) == "ok"


async def test_unknown_and_foreign_call_ids_get_unknown_call(url):
    async with session(url) as (conn_a, _), session(url) as (conn_b, _):
        calls = await say_until_calls(conn_a, "one")
        foreign = _answer(calls, "device_a", value="stolen")
        await conn_b.send(ToolResults(id="r1", results=[foreign]))
        error = await conn_b.recv()
        assert isinstance(error, Error)
        assert (error.code, error.in_reply_to, error.call_id) == (
            "unknown_call",
            "r1",
            foreign.call_id,
        )
        bogus = ToolResult(call_id="call_nope", tool="device_a", output={"value": "?"})
        await conn_a.send(ToolResults(results=[bogus]))
        error = await conn_a.recv()
        assert isinstance(error, Error)
        assert error.code == "unknown_call"
        # A's call is still open and answerable by A.
        await conn_a.send(ToolResults(results=[_answer(calls, "device_a", value="mine")]))
        events = await conn_a.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "A=mine"


@pytest.mark.parametrize(
    ("echo", "words"),
    [({"tool": "device_b"}, "names tool 'device_b'"), ({"display_name": "Other"}, "display_name")],
)
async def test_result_echoing_another_tool_is_rejected_and_the_call_stays_open(url, echo, words):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "one")
        call = calls.calls[0]
        fields = {"call_id": call.call_id, "tool": call.tool, "output": {"value": "x"}, **echo}
        await conn.send(ToolResults(id="r1", results=[ToolResult(**fields)]))
        error = await conn.recv()
        assert isinstance(error, Error)
        assert (error.code, error.call_id, error.in_reply_to) == (
            "invalid_result",
            call.call_id,
            "r1",
        )
        assert words in error.message
        await conn.send(ToolResults(results=[_answer(calls, "device_a", value="right")]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "A=right"


async def test_result_failing_output_schema_fails_the_call(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "one")
        await conn.send(ToolResults(id="r1", results=[_answer(calls, "device_a", value=42)]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    error, status = events[0], events[1]
    assert isinstance(error, Error)
    assert error.code == "invalid_result"
    assert "output schema" in error.message
    assert isinstance(status, ToolStatus)
    assert status.status == "failed"
    assert streamed_text(events).startswith("A failed: result does not match the output schema")


async def test_client_error_result_goes_to_the_model(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "one")
        call = calls.calls[0]
        failure = ToolResult(call_id=call.call_id, tool=call.tool, error="no device")
        await conn.send(ToolResults(results=[failure]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert isinstance(events[0], ToolStatus)
    assert events[0].status == "failed"
    assert streamed_text(events) == "A failed: no device"


async def test_arguments_failing_input_schema_never_reach_the_client(url):
    async with session(url) as (conn, _):
        events = await say(conn, "badargs")
    assert "tool.calls" not in types(events)
    status = next(e for e in events if isinstance(e, ToolStatus))
    assert status.status == "failed"
    assert "invalid arguments" in (status.error or "")
    assert streamed_text(events).startswith("strict failed: invalid arguments")


async def test_server_tool_result_feeds_the_next_step(url):
    async with session(url) as (conn, _):
        events = await say(conn, "add 2 40")
    assert types(events) == [
        "response.created",
        "tool.status",
        "tool.status",
        "text.delta",
        "text.done",
        "response.done",
    ]
    assert streamed_text(events) == "sum=42"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("explode", "explode failed: ValueError: kaboom"),
        ("hang", "hang failed: tool_timeout: the tool did not finish in time"),
        ("wrong", "wrong failed: result does not match the output schema"),
    ],
)
async def test_failing_server_tools_become_tool_errors(url, text, expected):
    async with session(url) as (conn, _):
        events = await say(conn, text)
        statuses = [e.status for e in events if isinstance(e, ToolStatus)]
        assert statuses == ["running", "failed"]
        assert streamed_text(events).startswith(expected)
        after = await say(conn, "echo fine")
    assert streamed_text(after) == "fine"


async def test_a_hung_tool_is_cancelled_at_its_timeout(url):
    before = dict(test_tools.hang_state)
    async with session(url) as (conn, _):
        await say(conn, "hang")
        # The cancel reaches the tool's task; wait for it rather than assume it.
        await say(conn, "echo sync point")
    assert test_tools.hang_state["started"] == before["started"] + 1
    assert test_tools.hang_state["cancelled"] == before["cancelled"] + 1


@pytest.mark.parametrize(
    ("text", "status", "partial"),
    [("break", "incomplete", "partial answer"), ("fail", "failed", "")],
    ids=["after some text: incomplete", "before any text: failed"],
)
async def test_broken_model_stream_ends_the_response_and_the_session_goes_on(
    url, text, status, partial
):
    async with session(url) as (conn, _):
        events = await say(conn, text)
        error = next(e for e in events if isinstance(e, Error))
        assert error.code == "provider_error"
        assert error.retryable
        assert "upstream broke" in error.message
        done = events[-1]
        assert error.response_id == done.response_id  # type: ignore[union-attr]
        assert isinstance(done, ResponseDone)
        assert done.status == status
        assert streamed_text(events) == partial
        after = await say(conn, "echo recovered")
    assert streamed_text(after) == "recovered"


async def test_message_sent_during_a_response_is_queued_and_answered_next(url):
    async with session(url) as (conn, _):
        calls = await say_until_calls(conn, "one")
        await conn.send(UserMessage(text="echo queued", id="q"))
        await conn.send(ToolResults(results=[_answer(calls, "device_a", value="v")]))
        first = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        second = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(first) == "A=v"
    assert isinstance(second[0], ResponseCreated)
    assert second[0].in_reply_to == "q"
    assert streamed_text(second) == "queued"


async def test_a_looping_model_stops_at_max_steps(url):
    async with session(url) as (conn, created):
        assert created.limits is not None
        # The rate limit is in force, and told (so that a client can stay inside it).
        assert (created.limits.max_messages_per_second, created.limits.max_message_burst) == (
            50.0,
            100,
        )
        events = await say(conn, "loop")
    error = next(e for e in events if isinstance(e, Error))
    assert error.code == "max_steps_exceeded"
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "incomplete"
    # The last step's calls are not run: no step would be left to use their results.
    completed = [e for e in events if isinstance(e, ToolStatus) and e.status == "completed"]
    assert len(completed) == created.limits.max_steps - 1

"""Async server tools over a real socket: pending at once, results later, three deliveries.

The test tools wait on gates the tests open, so every test decides exactly when
a tool finishes; the recording provider shows exactly what the model received.
"""

from __future__ import annotations

import asyncio

import pytest

from client_sdk import Connection
from gateway.core.transcript import ContextNote, ToolOutcome, UserTurn
from gateway.wire.v1 import (
    Outbound,
    ResponseCancel,
    ResponseCreated,
    ResponseDone,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.data.tools import gate, reset_gates
from tests.support import Gateway, say, serving, session, streamed_text, types

SHIPPED = '{"order_id":"1234","status":"shipped"}'


def note(tool: str, order_id: str = "1234") -> ContextNote:
    response = f'{{"order_id":"{order_id}","status":"shipped"}}'
    return ContextNote(
        text=f"<context>function [{tool}] completed with response {response}</context>",
        call_id=None,
    )


def notes_seen(gateway: Gateway) -> list[str]:
    """Every context note the model received, in its last request."""
    return [i.text for i in gateway.model.requests[-1].items if isinstance(i, ContextNote)]


@pytest.fixture
async def gateway():
    reset_gates()
    async with serving() as running:
        yield running


async def until_done(conn: Connection) -> list[Outbound]:
    return await conn.recv_until(lambda e: isinstance(e, ResponseDone))


def statuses(events: list[Outbound]) -> list[str]:
    return [e.status for e in events if isinstance(e, ToolStatus)]


async def test_when_idle_result_starts_a_response_after_the_user_chatted_on(gateway):
    async with session(gateway.url) as (conn, _):
        first = await say(conn, "order 1234")
        assert types(first) == [
            "response.created",
            "tool.status",
            *["text.delta"] * 3,
            "text.done",
            "response.done",
        ]
        pending = first[1]
        assert isinstance(pending, ToolStatus)
        assert (pending.tool, pending.status) == ("lookup_order", "pending")
        assert streamed_text(first) == "looking up 1234"
        # The model got {"status": "pending"} as the function response, at once.
        outcome = gateway.model.requests[-1].items[-1]
        assert outcome == ToolOutcome(
            call_id=pending.call_id, name="lookup_order", output={"status": "pending"}
        )
        chat = await say(conn, "echo anything else?")
        assert streamed_text(chat) == "anything else?"

        gate("order:1234").set()
        later = await until_done(conn)
    assert types(later) == [
        "tool.status",
        "response.created",
        *["text.delta"] * 4,
        "text.done",
        "response.done",
    ]
    completed, created = later[0], later[1]
    assert isinstance(completed, ToolStatus)
    assert (completed.call_id, completed.status) == (pending.call_id, "completed")
    assert completed.result == {"order_id": "1234", "status": "shipped"}
    assert isinstance(created, ResponseCreated)
    assert (created.call_id, created.in_reply_to) == (pending.call_id, None)
    assert streamed_text(later) == "order 1234 is shipped"
    last_item = gateway.model.requests[-1].items[-1]
    assert last_item == ContextNote(
        text=f"<context>function [lookup_order] completed with response {SHIPPED}</context>",
        call_id=pending.call_id,
    )


async def test_when_idle_result_joins_the_running_response_at_its_next_step(gateway):
    async with session(gateway.url) as (conn, _):
        await say(conn, "order 1234")
        await conn.send(UserMessage(text="one"))
        calls = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
        gate("order:1234").set()
        completed = await conn.recv()
        assert isinstance(completed, ToolStatus)
        assert completed.status == "completed"
        batch = calls[-1]
        assert isinstance(batch, ToolCalls)
        call = batch.calls[0]
        result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "v"})
        await conn.send(ToolResults(results=[result]))
        events = await until_done(conn)
    # No second response: the result rode along with the running one's next step.
    assert "response.created" not in types(events)
    assert streamed_text(events) == "A=v order 1234 is shipped"
    items = gateway.model.requests[-1].items
    assert isinstance(items[-2], ToolOutcome)
    assert isinstance(items[-1], ContextNote)
    assert items[-1].text == note("lookup_order").text


async def test_interrupt_result_cancels_the_running_response_and_starts_one(gateway):
    async with session(gateway.url) as (conn, _):
        first = await say(conn, "iorder 1234")
        pending = first[1]
        assert isinstance(pending, ToolStatus)
        assert pending.status == "pending"
        await conn.send(UserMessage(text="slowtext"))
        streaming = await conn.recv_until(lambda e: isinstance(e, TextDelta))
        interrupted_id = streaming[0].response_id  # type: ignore[union-attr]
        gate("order:1234").set()
        events = await conn.recv_until(
            lambda e: isinstance(e, ResponseDone) and e.response_id != interrupted_id
        )
    # Deltas already in flight may come first; from the completion on, the order is exact.
    tail = events[types(events).index("tool.status") :]
    assert not [e for e in tail if isinstance(e, TextDelta) and e.response_id == interrupted_id]
    assert types(tail) == [
        "tool.status",
        "response.done",
        "response.created",
        *["text.delta"] * 4,
        "text.done",
        "response.done",
    ]
    cancelled, created = tail[1], tail[2]
    assert isinstance(cancelled, ResponseDone)
    assert (cancelled.response_id, cancelled.status) == (interrupted_id, "cancelled")
    assert isinstance(created, ResponseCreated)
    assert created.call_id == pending.call_id
    assert streamed_text(tail) == "order 1234 is shipped"
    assert notes_seen(gateway)[-1] == note("lookup_order_now").text


async def test_silent_result_only_joins_the_context_of_the_next_model_call(gateway):
    async with session(gateway.url) as (conn, _):
        await say(conn, "sorder 1234")
        gate("order:1234").set()
        completed = await conn.recv()
        assert isinstance(completed, ToolStatus)
        assert completed.status == "completed"
        requests_before = len(gateway.model.requests)
        events = await say(conn, "echo what now?", msg_id="next")
    # Nothing started on its own: the next response is the user's.
    created = events[0]
    assert isinstance(created, ResponseCreated)
    assert created.in_reply_to == "next"
    assert len(gateway.model.requests) == requests_before + 1
    items = gateway.model.requests[-1].items
    assert items[-2] == ContextNote(
        text=note("lookup_order_quietly").text, call_id=completed.call_id
    )
    assert items[-1] == UserTurn(text="echo what now?")
    assert streamed_text(events) == "what now?"


async def test_two_async_tools_finishing_in_reverse_order(gateway):
    async with session(gateway.url) as (conn, _):
        first = await say(conn, "orders 1 2")
        assert statuses(first) == ["pending", "pending"]
        assert streamed_text(first) == "looking up 1 looking up 2"
        gate("order:2").set()
        second = await until_done(conn)
        gate("order:1").set()
        third = await until_done(conn)
    assert streamed_text(second) == "order 2 is shipped"
    assert streamed_text(third) == "order 1 is shipped"
    ids = [e.call_id for e in first if isinstance(e, ToolStatus)]
    assert [e.call_id for e in second + third if isinstance(e, ToolStatus)] == ids[::-1]


async def test_failing_async_tool_reaches_the_model_as_failed_context(gateway):
    async with session(gateway.url) as (conn, _):
        await say(conn, "order fail")
        gate("order:fail").set()
        events = await until_done(conn)
    failed = events[0]
    assert isinstance(failed, ToolStatus)
    assert (failed.status, failed.error) == ("failed", "LookupError: no such order")
    assert notes_seen(gateway)[-1] == (
        '<context>function [lookup_order] failed with error "LookupError: no such order"</context>'
    )
    assert streamed_text(events) == "order lookup failed: LookupError: no such order"


async def test_progress_events_come_between_pending_and_completed(gateway):
    async with session(gateway.url) as (conn, _):
        first = await say(conn, "porder 77")
        progress = [e for e in first if isinstance(e, ToolStatus) and e.status == "progress"]
        if len(progress) < 2:  # progress may still be on its way after the response ended
            more = await conn.recv_until(
                lambda e: isinstance(e, ToolStatus) and e.progress == {"step": 2, "of": 2}
            )
            progress += [e for e in more if isinstance(e, ToolStatus)]
        gate("order:77").set()
        last = await until_done(conn)
    assert [p.progress for p in progress] == [{"step": 1, "of": 2}, {"step": 2, "of": 2}]
    assert statuses(first)[0] == "pending"
    assert statuses(last) == ["completed"]


async def test_cancel_stops_a_sync_tool_and_a_client_call_but_not_an_async_tool(gateway):
    async with session(gateway.url) as (conn, _):
        await conn.send(UserMessage(text="mixed"))
        opened = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
        assert statuses(opened) == ["running"]
        await conn.send(ResponseCancel())
        cancelled = await until_done(conn)
        assert statuses(cancelled) == ["cancelled", "cancelled"]
        await asyncio.wait_for(gate("block_cancelled").wait(), 5)

        await conn.send(UserMessage(text="order_and_a 5"))
        opened = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
        assert statuses(opened) == ["pending"]
        await conn.send(ResponseCancel())
        cancelled = await until_done(conn)
        assert statuses(cancelled) == ["cancelled"]  # device_a only
        gate("order:5").set()
        later = await until_done(conn)
    assert statuses(later) == ["completed"]
    assert streamed_text(later) == "order 5 is shipped"


async def test_closing_the_session_cancels_every_tool_and_leaves_no_task(gateway):
    async with session(gateway.url) as (conn, _):
        await say(conn, "order 9")
        await conn.send(UserMessage(text="mixed"))
        await conn.recv_until(lambda e: isinstance(e, ToolCalls))
        assert len(gateway.runtime.drivers) == 1
    await asyncio.wait_for(gateway.runtime.idle.wait(), 5)
    assert gate("cancelled:9").is_set()
    assert gate("block_cancelled").is_set()
    leftovers = [
        t for t in asyncio.all_tasks() if t.get_name().startswith("gateway:") and not t.done()
    ]
    assert leftovers == []


async def test_demo_order_story(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "0.05")
    async with serving(agent=None, scripted_pace=0.0) as demo, session(demo.url) as (conn, _):
        first = await say(conn, "where is my order 1234?")
        assert streamed_text(first) == "I'm looking that up — anything else meanwhile?"
        pending = next(e for e in first if isinstance(e, ToolStatus))
        assert (pending.tool, pending.status) == ("check_order_status", "pending")
        later = await conn.recv_until(
            lambda e: isinstance(e, ResponseDone) and e.response_id != first[0].response_id  # type: ignore[union-attr]
        )
    done = next(e for e in later if isinstance(e, ToolStatus) and e.status == "completed")
    assert done.result is not None
    assert done.result["order_id"] == "1234"
    assert streamed_text(later).startswith("Update on order 1234:")
    assert any("check_order_status] completed with response" in n for n in notes_seen(demo))

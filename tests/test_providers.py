"""The HTTP model adapters against llmock, a real third-party mock of the vendors' APIs.

Each test runs for each provider: plain text, a client-function round trip, two
parallel calls, a stream cut mid-way, a 429 with Retry-After (announced to the client),
a stalled stream, and a cancel that must close the upstream request at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.wire.v1 import (
    Error,
    ResponseCancel,
    ResponseDone,
    ResponseRetrying,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    UserMessage,
)
from tests.mock_llm import mock_llm, now
from tests.support import say, serving, session, streamed_text

AGENT = Path(__file__).parent / "data" / "provider_agent.toml"
PROVIDERS = ["openai", "anthropic", "gemini"]


@pytest.fixture(params=PROVIDERS)
async def stack(request):
    async with mock_llm() as llm:
        async with serving(
            agent=str(AGENT),
            model=f"{request.param}:mock-model",
            base_url=llm.base_url(request.param),
        ) as gateway:
            yield request.param, llm, gateway


def tool_names(llm_body: dict, provider: str) -> list[str]:
    """The tools offered to the model, by name, in a request body."""
    if provider == "openai":
        return [t["function"]["name"] for t in llm_body["tools"]]
    if provider == "anthropic":
        return [t["name"] for t in llm_body["tools"]]
    return [d["name"] for t in llm_body["tools"] for d in t["functionDeclarations"]]


def tool_results(llm_body: dict, provider: str) -> list[tuple[str, str]]:
    """(call id, result as JSON text) pairs the model got in a request body."""
    if provider == "openai":
        return [
            (m["tool_call_id"], m["content"]) for m in llm_body["messages"] if m["role"] == "tool"
        ]
    if provider == "anthropic":
        return [
            (block["tool_use_id"], block["content"])
            for m in llm_body["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for block in m["content"]
            if block.get("type") == "tool_result"
        ]
    return [
        (part["functionResponse"]["id"], json.dumps(part["functionResponse"]["response"]))
        for content in llm_body["contents"]
        for part in content["parts"]
        if "functionResponse" in part
    ]


def requested_ids(llm_body: dict, provider: str) -> list[str]:
    """Ids of the tool calls the model made, as the gateway sent them back."""
    if provider == "openai":
        return [c["id"] for m in llm_body["messages"] for c in m.get("tool_calls") or []]
    if provider == "anthropic":
        return [
            block["id"]
            for m in llm_body["messages"]
            if m["role"] == "assistant" and isinstance(m["content"], list)
            for block in m["content"]
            if block.get("type") == "tool_use"
        ]
    return [
        part["functionCall"]["id"]
        for content in llm_body["contents"]
        for part in content["parts"]
        if "functionCall" in part
    ]


async def test_plain_text_streams(stack):
    _provider, llm, gateway = stack
    await llm.script({"type": "reply", "text": "Hello there, friend"})
    async with session(gateway.url) as (conn, _):
        events = await say(conn, "hi")
    assert streamed_text(events) == "Hello there, friend"
    assert [e.delta for e in events if isinstance(e, TextDelta)] != [
        "Hello there, friend"
    ]  # streamed
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "completed"
    (record,) = await llm.requests()
    assert record.stream


async def test_client_function_round_trip(stack):
    provider, llm, gateway = stack
    await llm.script(
        {"type": "reply", "tool_calls": [{"name": "device_a", "arguments": {}}]},
        {"type": "reply", "text": "A says x"},
    )
    async with session(gateway.url) as (conn, _):
        await conn.send(UserMessage(text="use A"))
        calls = (await conn.recv_until(lambda e: isinstance(e, ToolCalls)))[-1]
        (call,) = calls.calls
        assert (call.tool, call.args) == ("device_a", {})
        result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "x"})
        await conn.send(ToolResults(results=[result]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "A says x"
    first, second = await llm.requests()
    assert tool_names(first.body, provider) == ["device_a", "device_b"]
    assert requested_ids(second.body, provider) == [call.call_id]
    assert [(i, json.loads(r)) for i, r in tool_results(second.body, provider)] == [
        (call.call_id, {"value": "x"})
    ]


async def test_two_parallel_calls(stack):
    provider, llm, gateway = stack
    await llm.script(
        {
            "type": "reply",
            "tool_calls": [
                {"name": "device_a", "arguments": {}},
                {"name": "device_b", "arguments": {"n": 2}},
            ],
        },
        {"type": "reply", "text": "both answered"},
    )
    async with session(gateway.url) as (conn, _):
        await conn.send(UserMessage(text="use both"))
        calls = (await conn.recv_until(lambda e: isinstance(e, ToolCalls)))[-1]
        assert [(c.tool, c.args) for c in calls.calls] == [("device_a", {}), ("device_b", {"n": 2})]
        results = [
            ToolResult(call_id=c.call_id, tool=c.tool, output={"value": c.tool})
            for c in calls.calls
        ]
        await conn.send(ToolResults(results=results[::-1]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "both answered"
    _, second = await llm.requests()
    assert [i for i, _ in tool_results(second.body, provider)] == [c.call_id for c in calls.calls]


async def test_a_stream_cut_mid_way_ends_the_response_incomplete(stack):
    _provider, llm, gateway = stack
    await llm.script(
        {"type": "reply", "text": "one two three four five six seven eight"},
        {"type": "stream_fault", "kind": "disconnect", "after_chunks": 4},
        {"type": "reply", "text": "back again"},
    )
    async with session(gateway.url) as (conn, _):
        events = await say(conn, "talk")
        error = next(e for e in events if isinstance(e, Error))
        assert (error.code, error.retryable) == ("provider_error", True)
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.status == "incomplete"
        assert streamed_text(events)  # some text came before the cut
        after = await say(conn, "again")
    assert streamed_text(after) == "back again"


async def test_a_connection_lost_before_any_text_is_retried(stack):
    _provider, llm, gateway = stack
    await llm.script(
        {"type": "reply", "text": "made it", "times": 2},
        {"type": "stream_fault", "kind": "disconnect", "after_chunks": 0},
    )
    async with session(gateway.url) as (conn, _):
        events = await say(conn, "hi")
    assert streamed_text(events) == "made it"
    assert len(await llm.requests()) == 2


async def test_429_is_retried_after_retry_after(stack):
    _provider, llm, gateway = stack
    await llm.script(
        {"type": "fail", "status": 429, "retry_after": 0.4},
        {"type": "reply", "text": "worth the wait"},
    )
    async with session(gateway.url) as (conn, _):
        events = await say(conn, "hi")
    assert streamed_text(events) == "worth the wait"
    (notice,) = [e for e in events if isinstance(e, ResponseRetrying)]  # the client is told
    assert (notice.attempt, notice.delay, notice.reason) == (1, 0.4, "HTTP 429")
    refused, served = await llm.requests()
    assert refused.status == 429
    assert served.started_at - refused.ended_at >= 0.4


async def test_a_stalled_stream_ends_at_the_stall_timeout(stack):
    _provider, llm, gateway = stack
    await llm.script(
        {"type": "reply", "text": "one two three four five six"},
        {"type": "stream_fault", "kind": "stall", "after_chunks": 4, "stall_seconds": 10},
    )
    async with session(gateway.url) as (conn, _):
        started = now()
        events = await say(conn, "hi")
        (record,) = await llm.requests(wait=5)
    # A sanity bound, ten times the stall_timeout (0.5 s; bench/cancel_upstream.py prints
    # the figure); sitting the 10 s stall out would fail it.
    assert now() - started < 5
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "incomplete"
    error = next(e for e in events if isinstance(e, Error))
    assert "stalled" in error.message
    # The gateway hung up during the stall: the stream never finished.
    assert not record.completed
    assert record.stall_waited is not None
    assert record.stall_waited < 10


async def test_cancel_closes_the_upstream_request_mid_stream(stack):
    _provider, llm, gateway = stack
    await llm.script(
        {"type": "reply", "text": "one two three four five six"},
        {"type": "stream_fault", "kind": "stall", "after_chunks": 4, "stall_seconds": 10},
    )
    async with session(gateway.url) as (conn, _):
        await conn.send(UserMessage(text="hi"))
        await conn.recv_until(lambda e: isinstance(e, TextDelta))
        cancelled_at = now()
        await conn.send(ResponseCancel())
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        (record,) = await llm.requests(wait=5)
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "cancelled"
    # The cancel cut the upstream stream short: it never finished, nothing after the stall
    # (10 s, from the fifth chunk) went out, and the stall, if it began, was not sat through.
    assert not record.completed
    assert record.chunks_sent <= 4
    assert record.stall_waited is None or record.stall_waited < 10
    # A sanity bound, ten times the 0.1 s this test once asserted; bench/cancel_upstream.py
    # prints the figure (2 to 8 ms on an idle 2-core machine).
    assert record.ended_at - cancelled_at < 1.0, record.ended_at - cancelled_at

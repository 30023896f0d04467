"""Sessions that move between gateway nodes sharing one real redis-server.

Two gateways run in this process, each with its own runtime, store client and port,
on one redis-server: the client resumes on the other node and the session carries on
there (replay, open calls, async results, a result raced on both nodes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import websockets

from client_sdk import connect_raw
from gateway.errors import CloseCode
from gateway.protocol import (
    Error,
    ResponseCreated,
    ResponseDone,
    SessionResume,
    SessionResumed,
    SessionStart,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.data.tools import gate, reset_gates, runs
from tests.redis_server import RedisServer, redis_server
from tests.support import Gateway, ResumingClient, say, serving, session, streamed_text

LEASE_TTL = 1.0
"""Short, so that a node that lost a session learns it within a third of a second."""


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
async def nodes(redis: RedisServer) -> AsyncIterator[tuple[Gateway, Gateway]]:
    reset_gates()
    runs.clear()
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                serving(store=redis.url, node_id=name, lease_ttl=LEASE_TTL)
            )
            for name in ("node-a", "node-b")
        ]
        yield a, b


async def until(client: ResumingClient, kind: type) -> list[object]:
    events = []
    async with asyncio.timeout(10):
        while True:
            event = await client.next()
            events.append(event)
            if isinstance(event, kind):
                return events


async def started_on(url: str) -> ResumingClient:
    """A client with a new session on the node at ``url``."""
    client = ResumingClient(url)
    await client.start()
    return client


async def moved_to(client: ResumingClient, url: str) -> SessionResumed:
    """Cut the client's socket and resume on the node at ``url``."""
    await client.drop()
    client.url = url
    return await client.resume()


async def calls_for(client: ResumingClient, text: str) -> ToolCalls:
    """Say ``text`` and wait for the client-function calls it causes."""
    await client.send(UserMessage(text=text))
    events = await until(client, ToolCalls)
    calls = events[-1]
    assert isinstance(calls, ToolCalls)
    return calls


def text_of(events: list[object]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextDelta))


async def test_a_client_resumes_on_another_node_and_gets_what_it_missed(nodes):
    a, b = nodes
    client = await started_on(a.url)
    await client.send(UserMessage(text="echo one two three four"))
    first = await until(client, TextDelta)  # part of the answer, then the socket is cut
    resumed = await moved_to(client, b.url)
    assert resumed.last_seq >= client.last_seq
    rest = await until(client, ResponseDone)
    assert text_of(first + rest) == "one two three four"
    await client.send(UserMessage(text="echo on node b"))
    events = await until(client, ResponseDone)
    assert text_of(events) == "on node b"
    assert client.session_id in b.runtime.drivers
    await client.close()


async def test_a_client_call_open_on_one_node_is_answered_on_another(nodes):
    a, b = nodes
    client = await started_on(a.url)
    (call,) = (await calls_for(client, "one")).calls
    resumed = await moved_to(client, b.url)
    assert [c.call_id for c in resumed.open_calls] == [call.call_id]
    result = ToolResult(call_id=call.call_id, tool="device_a", output={"value": "x"})
    await client.send(ToolResults(results=[result]))
    events = await until(client, ResponseDone)
    assert "A=x" in [e.text for e in events if isinstance(e, TextDone)]
    await client.close()


async def test_an_async_result_finishing_on_the_old_node_reaches_the_new_one(nodes):
    a, b = nodes
    client = await started_on(a.url)
    await client.send(UserMessage(text="order 42"))
    await until(client, ResponseDone)  # the model got {"status": "pending"}
    await moved_to(client, b.url)
    gate("order:42").set()  # the tool runs on node a: its outcome is posted to node b
    events = await until(client, ResponseDone)
    created = next(e for e in events if isinstance(e, ResponseCreated))
    assert created.call_id is not None
    statuses = [e for e in events if isinstance(e, ToolStatus)]
    assert [s.status for s in statuses] == ["completed"]
    assert runs["lookup:42"] == 1
    await client.close()


async def test_the_same_result_sent_to_two_nodes_at_once_applies_once(nodes):
    a, b = nodes
    client = await started_on(a.url)
    (call,) = (await calls_for(client, "one")).calls
    result = ToolResults(
        results=[ToolResult(call_id=call.call_id, tool="device_a", output={"value": "x"})]
    )
    async with connect_raw(b.url) as other:
        # The client's second socket takes the session over on node b while its first,
        # on node a, sends the same result at the same moment.
        await other.send(
            SessionResume(
                session_id=client.session_id, resume_token=client.token, last_seq=client.last_seq
            )
        )
        assert isinstance(await other.recv(), SessionResumed)
        await asyncio.gather(client.send(result), other.send(result))
        texts: list[str] = []
        statuses: list[str] = []
        async with asyncio.timeout(10):
            while True:
                event = await other.recv()
                if isinstance(event, ToolStatus):
                    statuses.append(event.status if not event.duplicate else "duplicate")
                if isinstance(event, TextDone):
                    texts.append(event.text)
                if isinstance(event, ResponseDone):
                    break
        assert statuses.count("completed") == 1
        assert texts == ["A=x"]


async def test_with_redis_down_a_live_conversation_goes_on_and_new_sessions_get_1013(nodes, redis):
    a, _ = nodes
    async with session(a.url) as (conn, _created):
        assert streamed_text(await say(conn, "echo before")) == "before"
        redis.stop()
        events = await say(conn, "echo during the outage")
        errors = [e for e in events if isinstance(e, Error)]
        assert [e.code for e in errors] == ["store_unavailable"]
        assert errors[0].retryable
        assert streamed_text(events) == "during the outage"
        assert streamed_text(await say(conn, "echo still")) == "still"  # told once
        async with connect_raw(a.url) as other:
            await other.send(SessionStart())
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await other.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == CloseCode.TRY_AGAIN
            assert "store" in closed.value.rcvd.reason


async def test_a_resume_back_on_a_node_that_has_not_noticed_it_lost_the_session(redis):
    # Leases far longer than the test: the first node never learns from a renewal that
    # the second took the session over. The resume back must still find the newest state.
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(serving(store=redis.url, node_id=name, lease_ttl=60.0))
            for name in ("node-a", "node-b")
        ]
        client = await started_on(a.url)
        await client.send(UserMessage(text="echo one"))
        await until(client, ResponseDone)
        await moved_to(client, b.url)
        await client.send(UserMessage(text="echo two"))
        await until(client, ResponseDone)
        await moved_to(client, a.url)  # replayed from where this client is: no gap
        await client.send(UserMessage(text="echo three"))
        assert text_of(await until(client, ResponseDone)) == "three"
        await client.close()


async def _read_into(client: ResumingClient, events: list[object]) -> None:
    """Read events into ``events`` until the socket closes (or 10 s pass)."""
    async with asyncio.timeout(10):
        while True:
            events.append(await client.next())


SLOW_TEXT = (
    "this answer streams slowly word by word so that a test can cancel it in the middle of the"
    " stream and check that nothing else arrives afterwards even though many more words were"
    " still to come in this long and rather boring sentence that goes on and on"
)


async def test_a_node_shutting_down_hands_its_sessions_over_mid_answer(nodes, redis):
    a, b = nodes
    client = await started_on(a.url)
    await client.send(UserMessage(text="slowtext"))
    before = await until(client, TextDelta)
    # A deploy: node a stops with a short grace; the answer is cut there, not ended.
    shutdown = asyncio.create_task(a.runtime.shutdown(grace=0.2))
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await _read_into(client, before)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CloseCode.SERVICE_RESTART
    await shutdown
    assert client.session_id not in a.runtime.drivers
    client.url = b.url
    await client.resume()  # node b takes it over and runs the cut step again
    after = await until(client, ResponseDone)
    assert text_of(before + after) == SLOW_TEXT  # nothing repeated, nothing missing
    done = after[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "completed"
    await client.close()

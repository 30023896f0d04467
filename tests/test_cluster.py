"""Sessions that move between gateway nodes sharing one real redis-server.

Two gateways run in this process, each with its own runtime, store client and port,
on one redis-server. The client is the shipped SDK, connected through a proxy (a load
balancer of sorts) that the test points at the other node before it cuts the socket
or the node closes it (1012 at a shutdown, 1013 when the session moved): the SDK
resumes there and the session carries on (replay, open calls, async results), nothing
lost, nothing run twice, every event once and in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import websockets

from client_sdk import Conversation, EventStream, connect, connect_raw
from client_sdk.client import MOVED
from gateway.errors import CloseCode
from gateway.wire.v1 import (
    Error,
    Outbound,
    ResponseCreated,
    ResponseDone,
    SessionGoingAway,
    SessionResumed,
    SessionSnapshot,
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
from tests.proxy import Proxy, proxy_to
from tests.redis_server import RedisServer
from tests.support import Gateway, resuming, say, serving, session, streamed_text

LEASE_TTL = 1.0
"""Short, so that a node that lost a session learns it within a third of a second."""


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


class Client:
    """The SDK's conversation through a proxy, and every event it delivered."""

    def __init__(self, conv: Conversation, proxy: Proxy, events: EventStream) -> None:
        self.conv = conv
        self.proxy = proxy
        self._stream = events
        self.events: list[Outbound] = []

    async def until(self, found: Callable[[Outbound], bool]) -> list[Outbound]:
        """The events up to the first that ``found`` accepts (at most 10 s)."""
        start = len(self.events)
        async with asyncio.timeout(10):
            async for event in self._stream:
                self.events.append(event)
                if found(event):
                    return self.events[start:]
        raise AssertionError("the events ended")

    async def until_a(self, kind: type) -> list[Outbound]:
        return await self.until(lambda e: isinstance(e, kind))

    def move_to(self, node: Gateway) -> None:
        """Point new connections at ``node`` (as a load balancer would after a change)."""
        self.proxy.upstream = node.port

    def check_stream(self) -> None:
        """Every event with a seq came once and in order, none missing, no gap."""
        seqs = [e.seq for e in self.events if e.seq]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert not [e for e in self.events if isinstance(e, SessionSnapshot)]


@asynccontextmanager
async def client_on(node: Gateway, **functions: Callable[..., object]) -> AsyncIterator[Client]:
    """An SDK conversation started on ``node`` through a proxy, with these client functions."""
    async with proxy_to(node.port) as proxy:
        conv = connect(proxy.url(), max_reconnect_delay=0.2)
        for name, func in functions.items():
            conv.add_client_function(func, name=name)
        async with conv:
            client = Client(conv, proxy, conv.events())
            await conv.start()
            yield client
            client.check_stream()


async def moved_to(client: Client, node: Gateway) -> SessionResumed:
    """Cut the client's socket and let the SDK resume on ``node``, from its cursor: the
    replay starts just after the last event the SDK delivered before the resume."""
    client.move_to(node)
    client.proxy.drop()
    resumed = (await client.until_a(SessionResumed))[-1]
    assert isinstance(resumed, SessionResumed)
    delivered = [e.seq for e in client.events[:-1] if e.seq]
    assert resumed.replayed_from == delivered[-1] + 1
    return resumed


async def said(client: Client, text: str) -> list[Outbound]:
    """Post ``text`` and return the events up to the end of the response to it."""
    msg_id = await client.conv.post(text)
    created = (await client.until(lambda e: _answers(e, msg_id)))[-1]
    assert isinstance(created, ResponseCreated)
    return await client.until(lambda e: _ends(e, created.response_id))


def _answers(event: Outbound, msg_id: str) -> bool:
    return isinstance(event, ResponseCreated) and event.in_reply_to == msg_id


def _ends(event: Outbound, response_id: str) -> bool:
    return isinstance(event, ResponseDone) and event.response_id == response_id


def text_of(events: list[Outbound]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextDelta))


async def test_a_client_resumes_on_another_node_and_gets_what_it_missed(nodes):
    a, b = nodes
    async with client_on(a) as client:
        await client.conv.post("echo one two three four")
        first = await client.until_a(TextDelta)  # part of the answer, then the socket is cut
        await moved_to(client, b)
        rest = await client.until_a(ResponseDone)
        assert text_of(first + rest) == "one two three four"
        assert text_of(await said(client, "echo on node b")) == "on node b"
        assert client.conv.session is not None
        assert client.conv.session.session_id in b.runtime.drivers
        assert client.conv.reconnects == 1


async def test_a_client_call_open_on_one_node_is_answered_on_another(nodes):
    a, b = nodes
    release = asyncio.Event()
    ran: list[str] = []

    async def device_a() -> dict[str, str]:
        ran.append("device_a")
        await release.wait()  # still running when the session moves
        return {"value": "x"}

    async with client_on(a, device_a=device_a) as client:
        await client.conv.post("one")
        calls = (await client.until_a(ToolCalls))[-1]
        assert isinstance(calls, ToolCalls)
        (call,) = calls.calls
        resumed = await moved_to(client, b)
        assert [c.call_id for c in resumed.open_calls] == [call.call_id]
        release.set()  # the result goes to node b
        events = await client.until_a(ResponseDone)
    assert "A=x" in [e.text for e in events if isinstance(e, TextDone)]
    assert ran == ["device_a"]  # offered again after the resume, not run again
    applied = [e for e in client.events if isinstance(e, ToolStatus) and not e.duplicate]
    assert [(s.call_id, s.status) for s in applied] == [(call.call_id, "completed")]


async def test_an_async_result_finishing_on_the_old_node_reaches_the_new_one(nodes):
    a, b = nodes
    async with client_on(a) as client:
        await said(client, "order 42")  # the model got {"status": "pending"}
        await moved_to(client, b)
        gate("order:42").set()  # the tool runs on node a: its outcome is posted to node b
        events = await client.until_a(ResponseDone)
    created = next(e for e in events if isinstance(e, ResponseCreated))
    assert created.call_id is not None
    statuses = [e for e in events if isinstance(e, ToolStatus)]
    assert [s.status for s in statuses] == ["completed"]
    assert runs["lookup:42"] == 1


async def test_the_same_result_sent_to_two_nodes_at_once_applies_once(nodes):
    # A protocol race, not a client's resilience: two raw sockets send the same result.
    a, b = nodes
    async with session(a.url) as (conn, created):
        await conn.send(UserMessage(text="one"))
        calls = (await conn.recv_until(lambda e: isinstance(e, ToolCalls)))[-1]
        assert isinstance(calls, ToolCalls)
        (call,) = calls.calls
        result = ToolResults(
            results=[ToolResult(call_id=call.call_id, tool="device_a", output={"value": "x"})]
        )
        # The client's second socket takes the session over on node b while its first,
        # on node a, sends the same result at the same moment.
        async with resuming(b.url, created, calls.seq) as (other, resumed):
            assert isinstance(resumed, SessionResumed)
            await asyncio.gather(conn.send(result), other.send(result))
            events = await other.recv_until(lambda e: isinstance(e, ResponseDone))
    statuses = [
        "duplicate" if e.duplicate else e.status for e in events if isinstance(e, ToolStatus)
    ]
    assert statuses.count("completed") == 1
    assert [e.text for e in events if isinstance(e, TextDone)] == ["A=x"]


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
        async with client_on(a) as client:
            assert text_of(await said(client, "echo one")) == "one"
            await moved_to(client, b)
            assert text_of(await said(client, "echo two")) == "two"
            await moved_to(client, a)  # replayed from where the SDK is: no gap
            assert text_of(await said(client, "echo three")) == "three"


async def test_a_session_moved_away_under_an_open_socket_is_resumed_after_1013(nodes):
    a, b = nodes
    async with client_on(a) as client:
        assert text_of(await said(client, "echo on a")) == "on a"
        first_socket = client.conv._ws
        assert first_socket is not None
        conv_session = client.conv.session
        assert conv_session is not None
        client.move_to(b)
        # Another socket resumes the session on node b while the SDK's is open on node a
        # (a half-open route, a second tab): node a closes the SDK's socket with 1013.
        async with resuming(b.url, conv_session, client.conv.last_seq) as (other, resumed):
            assert isinstance(resumed, SessionResumed)
            await client.until_a(SessionResumed)  # the SDK took it back, on node b
            with pytest.raises(websockets.ConnectionClosed) as taken:
                await other.recv()
        assert taken.value.rcvd is not None
        assert taken.value.rcvd.code == CloseCode.TAKEN_OVER
        assert first_socket.close_code == CloseCode.TRY_AGAIN
        assert first_socket.close_reason == "session moved to another node: resume"
        assert text_of(await said(client, "echo on b")) == "on b"
        assert conv_session.session_id in b.runtime.drivers


SLOW_TEXT = (
    "this answer streams slowly word by word so that a test can cancel it in the middle of the"
    " stream and check that nothing else arrives afterwards even though many more words were"
    " still to come in this long and rather boring sentence that goes on and on"
)


async def test_a_node_shutting_down_hands_its_sessions_over_mid_answer(nodes, redis):
    a, b = nodes
    async with client_on(a) as client:
        await client.conv.post("slowtext")
        before = await client.until_a(TextDelta)
        first_socket = client.conv._ws
        assert first_socket is not None
        client.move_to(b)  # the load balancer sends new connections to the node that stays
        # A deploy: node a stops with a short grace; the answer is cut there, not ended.
        await a.runtime.shutdown(grace=0.2)
        assert client.conv.session is not None
        assert client.conv.session.session_id not in a.runtime.drivers
        after = await client.until_a(ResponseDone)  # node b runs the cut step again
    # Told first (session.going_away); then node a closed the socket with 1012, or the SDK,
    # which moved on to node b at the notice, closed it itself (4000).
    notices = [e for e in before + after if isinstance(e, SessionGoingAway)]
    assert [(n.reason, n.time_left) for n in notices] == [("shutdown", 0.0)]
    assert first_socket.close_code in (CloseCode.SERVICE_RESTART, MOVED)
    assert client.conv.reconnects == 1
    assert text_of(before + after) == SLOW_TEXT  # nothing repeated, nothing missing
    done = after[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "completed"

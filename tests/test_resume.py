"""The resume protocol over real sockets, at exact seq numbers: replay, open calls,
takeover, refusals, expiry, gaps, ack.

These speak the protocol with the raw connection and explicit ``session.resume`` frames;
how a client survives drops (cursor, resending, backoff) is the shipped SDK's job, tested
in test_sdk_resume.py, test_torture.py and test_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import websockets

from client_sdk import Connection, connect_raw
from gateway.wire.v1 import (
    Ack,
    Error,
    Outbound,
    ResponseDone,
    SessionResume,
    SessionResumed,
    SessionSnapshot,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.data.tools import gate, reset_gates
from tests.support import Gateway, resuming, serving, session


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    reset_gates()
    async with serving() as running:
        yield running


async def cut(conn: Connection) -> None:
    """Lose the socket the hard way (no close frame, as a phone does; a normal close would
    end the session) and wait until it is gone."""
    conn.websocket.transport.abort()
    await asyncio.wait_for(conn.websocket.wait_closed(), 5)


async def until(conn: Connection, kind: type) -> list[Outbound]:
    return await conn.recv_until(lambda e: isinstance(e, kind))


async def test_resume_replays_what_was_missed_in_order_exactly_once(gateway):
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text="echo one two three four five"))
        seen = [created, *await until(conn, TextDelta)]  # response.created, the first delta
        await cut(conn)
    async with resuming(gateway.url, created, seen[-1].seq) as (conn, resumed):
        assert isinstance(resumed, SessionResumed)
        assert resumed.replayed_from == seen[-1].seq + 1
        assert resumed.last_seq >= seen[-1].seq
        rest = await until(conn, ResponseDone)
    events = seen + rest
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    deltas = [e.delta for e in events if isinstance(e, TextDelta)]
    assert "".join(deltas) == "one two three four five"
    assert next(e for e in rest if isinstance(e, TextDone)).text == "one two three four five"


async def test_open_client_call_is_offered_again_and_its_result_applied_once(gateway):
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text="one"))
        before = await until(conn, ToolCalls)
        calls = before[-1]
        assert isinstance(calls, ToolCalls)
        call = calls.calls[0]
        await cut(conn)  # before the client answered: the call is still open
    result = ToolResults(
        results=[ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "x"})]
    )
    async with resuming(gateway.url, created, calls.seq) as (conn, resumed):
        assert isinstance(resumed, SessionResumed)
        assert [c.call_id for c in resumed.open_calls] == [call.call_id]
        await conn.send(result)
        await conn.send(result)  # sent twice (the client could not tell): applied once
        after = await answered_and_done(conn)
    statuses = [(e.status, e.duplicate) for e in after if isinstance(e, ToolStatus)]
    assert statuses == [("completed", False), ("completed", True)]
    texts = [e.text for e in before + after if isinstance(e, TextDone)]
    assert texts == ["calling A", "A=x"]


async def test_a_result_that_arrived_before_the_drop_is_not_offered_again(gateway):
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text="one"))
        before = await until(conn, ToolCalls)
        calls = before[-1]
        assert isinstance(calls, ToolCalls)
        call = calls.calls[0]
        result = ToolResults(
            results=[ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "x"})]
        )
        await conn.send(result)
        applied = await conn.recv_until(
            lambda e: isinstance(e, ToolStatus) and e.status == "completed"
        )
        await cut(conn)  # after the gateway applied it
    assert not applied[-1].duplicate
    async with resuming(gateway.url, created, applied[-1].seq) as (conn, resumed):
        assert isinstance(resumed, SessionResumed)
        assert resumed.open_calls == []
        await conn.send(result)  # sent again (the client could not tell): a duplicate
        after = await answered_and_done(conn)
    statuses = [(e.status, e.duplicate) for e in after if isinstance(e, ToolStatus)]
    assert statuses == [("completed", True)]
    texts = [e.text for e in before + applied + after if isinstance(e, TextDone)]
    assert texts == ["calling A", "A=x"]


async def answered_and_done(conn: Connection) -> list[Outbound]:
    """Events until both the duplicate's ``tool.status`` and ``response.done`` came (in
    either order: the response may end before the duplicate is read)."""
    seen: list[Outbound] = []

    def both(event: Outbound) -> bool:
        seen.append(event)
        return any(isinstance(e, ResponseDone) for e in seen) and any(
            isinstance(e, ToolStatus) and e.duplicate for e in seen
        )

    return await conn.recv_until(both)


async def test_an_async_result_that_comes_while_away_is_replayed_and_is_no_open_call(gateway):
    # open_calls lists the client's own calls to answer; a server tool's call (async here)
    # is the gateway's to finish, so it is never in them, pending or done.
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text="order 7"))
        done = (await until(conn, ResponseDone))[-1]
        await cut(conn)
    # While the client is away the async result arrives and a response runs.
    gate("order:7").set()
    async with resuming(gateway.url, created, done.seq) as (conn, resumed):
        events = await until(conn, ResponseDone)
    assert isinstance(resumed, SessionResumed)
    assert resumed.open_calls == []
    assert events[0].seq == done.seq + 1
    assert [e.status for e in events if isinstance(e, ToolStatus)] == ["completed"]
    assert [e.text for e in events if isinstance(e, TextDone)] == ["order 7 is shipped"]


async def refused_with(url: str, resume: SessionResume) -> int:
    """The close code a socket gets for ``resume``."""
    async with connect_raw(url) as conn:
        await conn.send(resume)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await conn.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


async def test_wrong_token_unknown_and_expired_sessions_are_refused():
    reset_gates()
    async with serving(session_ttl=0.2) as gateway:
        async with session(gateway.url) as (conn, created):
            await cut(conn)
        wrong_token = SessionResume(session_id=created.session_id, resume_token="no", last_seq=0)
        assert await refused_with(gateway.url, wrong_token) == 4001
        unknown = SessionResume(session_id="sess_unknown", resume_token="x", last_seq=0)
        assert await refused_with(gateway.url, unknown) == 4004
        await asyncio.wait_for(gateway.runtime.idle.wait(), 5)  # the ttl ran out
        right = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=0
        )
        assert await refused_with(gateway.url, right) == 4008


async def test_resume_while_the_old_socket_is_open_takes_the_session_over(gateway):
    async with session(gateway.url) as (old, created):
        async with resuming(gateway.url, created, created.seq) as (conn, resumed):
            assert isinstance(resumed, SessionResumed)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await old.recv()
            await conn.send(UserMessage(text="echo still mine"))
            events = await until(conn, ResponseDone)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4009
    assert events[0].seq == created.seq + 1
    assert [e.text for e in events if isinstance(e, TextDone)] == ["still mine"]


async def test_gap_gets_resume_gap_and_a_snapshot_to_rebuild_from():
    async with serving(replay_max_events=3) as gateway:
        async with session(gateway.url) as (conn, created):
            await conn.send(UserMessage(text="echo a b c d e f"))
            await until(conn, ResponseDone)
            await conn.send(UserMessage(text="one"))
            last = (await until(conn, ToolCalls))[-1]
            await cut(conn)
        async with resuming(gateway.url, created, created.seq) as (conn, error):
            snapshot = await conn.recv()
            assert isinstance(snapshot, SessionSnapshot)
            call = snapshot.open_calls[0]
            result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "z"})
            await conn.send(ToolResults(results=[result]))
            live = await until(conn, ResponseDone)
    assert isinstance(error, Error)
    assert (error.code, error.seq) == ("resume_gap", 0)
    assert [(t.role, t.text) for t in snapshot.transcript] == [
        ("user", "echo a b c d e f"),
        ("assistant", "a b c d e f"),
        ("user", "one"),
        ("assistant", "calling A"),
    ]
    assert [c.tool for c in snapshot.open_calls] == ["device_a"]
    assert snapshot.last_seq == last.seq
    assert live[0].seq == snapshot.last_seq + 1
    assert [e.text for e in live if isinstance(e, TextDone)] == ["A=z"]


async def test_ack_lets_the_server_forget_acknowledged_events(gateway):
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text="echo to be acked"))
        acked = (await until(conn, ResponseDone))[-1]
        await conn.send(Ack(seq=acked.seq))
        await conn.send(UserMessage(text="echo after ack"))
        last = (await until(conn, ResponseDone))[-1]
        await cut(conn)
    async with resuming(gateway.url, created, created.seq) as (conn, error):
        assert isinstance(error, Error)
        assert error.code == "resume_gap"  # the acknowledged events are gone
        await cut(conn)
    async with resuming(gateway.url, created, last.seq) as (conn, resumed):
        assert isinstance(resumed, SessionResumed)  # from the real cursor: nothing missing
        assert resumed.replayed_from == resumed.last_seq + 1 == last.seq + 1
        await cut(conn)


async def test_a_client_that_never_reads_is_cut_with_1013_and_memory_stays_bounded(tmp_path):
    words = 60_000  # ~500 KB of deltas: far more than the socket buffers and the bounds
    text = " ".join(f"w{i}" for i in range(words))
    (tmp_path / "scenario.toml").write_text(
        f"pace = 0\n[[rules]]\nmatch = 'flood'\nsay = '{text}'\n"
    )
    (tmp_path / "agent.toml").write_text(
        'name = "flood"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
    )
    soft, hard = 16 * 1024, 64 * 1024
    async with serving(
        agent=str(tmp_path / "agent.toml"),
        outbound_soft_size=soft,
        outbound_hard_size=hard,
        send_buffer=4096,
    ) as gateway:
        # max_queue=1: once a frame waits unread, this client stops reading the socket.
        websocket = await websockets.connect(gateway.url, subprotocols=["gateway.v1"], max_queue=1)
        await websocket.send(json.dumps({"type": "session.start"}))
        created = json.loads(await websocket.recv())
        await websocket.send(json.dumps({"type": "user.message", "text": "flood"}))
        driver = gateway.runtime.drivers[created["session_id"]]
        conn = driver.connection
        assert conn is not None
        await asyncio.wait_for(conn.close_requested.wait(), 30)
        assert conn.close_code == 1013
        assert conn.merged > 0  # deltas were merged before giving up
        websocket.transport.abort()
        await asyncio.wait_for(conn.done.wait(), 30)
        await asyncio.wait_for(driver.quiet.wait(), 30)  # the response ran to its end
        events, size = gateway.runtime.store.log_size(created["session_id"])  # type: ignore[attr-defined]
        assert events <= gateway.runtime.config.replay_max_events
        assert size <= gateway.runtime.config.replay_max_size
        # The session lived on; the log no longer reaches back, so the client rebuilds.
        async with connect_raw(gateway.url) as fresh:
            resume = SessionResume(
                session_id=created["session_id"], resume_token=created["resume_token"], last_seq=1
            )
            await fresh.send(resume)
            error, snapshot = await fresh.recv(), await fresh.recv()
    assert isinstance(error, Error)
    assert error.code == "resume_gap"
    assert isinstance(snapshot, SessionSnapshot)
    assert [(t.role, t.text) for t in snapshot.transcript] == [
        ("user", "flood"),
        ("assistant", text),
    ]

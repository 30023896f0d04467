"""Lossless sessions over real sockets: resume, replay, takeover, expiry, gaps, ack."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from client_sdk import connect_raw
from gateway.protocol import (
    Ack,
    Error,
    ResponseDone,
    SessionResume,
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
from tests.support import ResumingClient, serving


@pytest.fixture
async def gateway():
    reset_gates()
    async with serving() as running:
        yield running


async def until(client: ResumingClient, kind: type) -> list:
    events = []
    while True:
        event = await client.next()
        events.append(event)
        if isinstance(event, kind):
            return events


async def probe(url: str, client: ResumingClient, last_seq: int) -> tuple[object, object]:
    """Resume from ``last_seq`` on a side socket, read two events, drop the socket
    (a normal close would end the session)."""
    async with connect_raw(url) as conn:
        resume = SessionResume(
            session_id=client.session_id, resume_token=client.token, last_seq=last_seq
        )
        await conn.send(resume)
        first, second = await conn.recv(), await conn.recv()
        conn.websocket.transport.abort()
    return first, second


async def test_resume_replays_what_was_missed_in_order_exactly_once(gateway):
    client = ResumingClient(gateway.url)
    await client.start()
    await client.send(UserMessage(text="echo one two three four five"))
    await client.next()  # response.created
    await client.next()  # the first delta
    await client.drop()
    resumed = await client.resume()
    assert resumed.last_seq >= client.last_seq
    events = await until(client, ResponseDone)
    await client.close()
    deltas = [e.delta for e in client.events if isinstance(e, TextDelta)]
    assert "".join(deltas) == "one two three four five"
    assert next(e for e in events if isinstance(e, TextDone)).text == "one two three four five"
    assert [e.seq for e in client.events] == list(range(1, client.last_seq + 1))


async def test_open_client_call_is_offered_again_and_its_result_applied_once(gateway):
    client = ResumingClient(gateway.url)
    await client.start()
    await client.send(UserMessage(text="one"))
    calls = (await until(client, ToolCalls))[-1]
    call = calls.calls[0]
    # The answer leaves just before the drop, and is sent again after the resume.
    await client.send(
        ToolResults(
            results=[ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "x"})]
        )
    )
    await client.drop()
    resumed = await client.resume()
    events = await until(client, ResponseDone)
    statuses = [e for e in client.events if isinstance(e, ToolStatus)]
    await client.close()
    assert [c.call_id for c in resumed.open_calls] in ([call.call_id], [])
    assert [(s.status, s.duplicate) for s in statuses if not s.duplicate] == [("completed", False)]
    texts = [e.text for e in client.events if isinstance(e, TextDone)]
    assert texts == ["calling A", "A=x"]
    assert isinstance(events[-1], ResponseDone)


async def test_call_opened_while_away_is_in_open_calls(gateway):
    client = ResumingClient(gateway.url)
    await client.start()
    await client.send(UserMessage(text="order 7"))
    await until(client, ResponseDone)
    await client.drop()
    # While the client is away the async result arrives and a response runs.
    gate("order:7").set()
    resumed = await client.resume()
    events = await until(client, ResponseDone)
    await client.close()
    assert resumed.open_calls == []
    assert [e.status for e in events if isinstance(e, ToolStatus)] == ["completed"]
    assert [e.text for e in events if isinstance(e, TextDone)] == ["order 7 is shipped"]


async def test_wrong_token_unknown_and_expired_sessions_are_refused():
    reset_gates()
    async with serving(session_ttl=0.2) as gateway:
        client = ResumingClient(gateway.url)
        created = await client.start()
        await client.drop()
        for resume, code in [
            (SessionResume(session_id=created.session_id, resume_token="nope", last_seq=0), 4001),
            (SessionResume(session_id="sess_unknown", resume_token="x", last_seq=0), 4004),
        ]:
            async with connect_raw(gateway.url) as conn:
                await conn.send(resume)
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await conn.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == code
        await asyncio.wait_for(gateway.runtime.idle.wait(), 5)  # the ttl ran out
        async with connect_raw(gateway.url) as conn:
            await conn.send(
                SessionResume(
                    session_id=created.session_id, resume_token=created.resume_token, last_seq=0
                )
            )
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await conn.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4008


async def test_resume_while_the_old_socket_is_open_takes_the_session_over(gateway):
    client = ResumingClient(gateway.url)
    await client.start()
    old = client.conn
    assert old is not None
    await client.resume()
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await old.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4009
    await client.send(UserMessage(text="echo still mine"))
    events = await until(client, ResponseDone)
    await client.close()
    assert [e.text for e in events if isinstance(e, TextDone)] == ["still mine"]


async def test_gap_gets_resume_gap_and_a_snapshot_to_rebuild_from():
    async with serving(replay_max_events=3) as gateway:
        client = ResumingClient(gateway.url)
        await client.start()
        await client.send(UserMessage(text="echo a b c d e f"))
        await until(client, ResponseDone)
        await client.send(UserMessage(text="one"))
        await until(client, ToolCalls)
        await client.drop()
        async with connect_raw(gateway.url) as conn:
            await conn.send(
                SessionResume(session_id=client.session_id, resume_token=client.token, last_seq=1)
            )
            error, snapshot = await conn.recv(), await conn.recv()
            assert isinstance(snapshot, SessionSnapshot)
            call = snapshot.open_calls[0]
            result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "z"})
            await conn.send(ToolResults(results=[result]))
            live = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert isinstance(error, Error)
    assert (error.code, error.seq) == ("resume_gap", 0)
    assert isinstance(snapshot, SessionSnapshot)
    assert [(t.role, t.text) for t in snapshot.transcript] == [
        ("user", "echo a b c d e f"),
        ("assistant", "a b c d e f"),
        ("user", "one"),
        ("assistant", "calling A"),
    ]
    assert [c.tool for c in snapshot.open_calls] == ["device_a"]
    assert snapshot.last_seq == client.last_seq
    assert live[0].seq == snapshot.last_seq + 1
    assert [e.text for e in live if isinstance(e, TextDone)] == ["A=z"]


async def test_ack_lets_the_server_forget_acknowledged_events(gateway):
    client = ResumingClient(gateway.url)
    await client.start()
    await client.send(UserMessage(text="echo to be acked"))
    await until(client, ResponseDone)
    await client.send(Ack(seq=client.last_seq))
    await client.send(UserMessage(text="echo after ack"))
    await until(client, ResponseDone)
    await client.drop()
    error, _ = await probe(gateway.url, client, last_seq=1)
    assert isinstance(error, Error)
    assert error.code == "resume_gap"
    resumed = await client.resume()  # from its real cursor: nothing missing
    await client.close()
    assert resumed.replayed_from == resumed.last_seq + 1


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

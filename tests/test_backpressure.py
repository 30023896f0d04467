"""A client that sends faster than its session applies is held back, not queued without bound."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets import ConnectionClosed

from client_sdk import Connection, connect_raw
from gateway.shell.connection import Connection as ServerConnection
from gateway.shell.driver import Driver
from gateway.shell.inbox import Inbox
from gateway.store import Store
from gateway.wire.v1 import Error, Outbound, Ping, Pong, SessionResume, SessionResumed
from tests.support import Gateway, serving, session

_BOUND = 16


class _SlowStore:
    """The gateway's store, with the event writes of chosen sessions held until released:
    a store that stops answering, so that those sessions stop applying events."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.held: set[str] = set()
        self.released = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        if session_id in self.held:
            await self.released.wait()
        await self._inner.append_event(session_id, seq, data)


def _slow_store(gateway: Gateway) -> _SlowStore:
    store = _SlowStore(gateway.runtime.store)
    gateway.runtime.store = store  # type: ignore[assignment]  # sessions started from now on
    return store


def _server_side(gateway: Gateway, session_id: str) -> tuple[Driver, ServerConnection, Inbox]:
    driver = gateway.runtime.drivers[session_id]
    conn = driver.connection
    assert conn is not None
    assert conn.inbox is not None
    return driver, conn, conn.inbox


async def _read_until_closed(conn: Connection) -> tuple[list[Outbound], ConnectionClosed]:
    events = []
    while True:
        try:
            events.append(await conn.recv())
        except ConnectionClosed as closed:
            return events, closed


async def _flood(conn: Connection, frames: int) -> None:
    for i in range(frames):
        await conn.websocket.send(json.dumps({"type": "ping", "ts": i}))


async def _round_trips(conn: Connection, count: int) -> list[float]:
    loop = asyncio.get_running_loop()
    times = []
    for i in range(count):
        sent = loop.time()
        await conn.send(Ping(ts=float(i)))
        assert isinstance(await conn.recv(), Pong)
        times.append(loop.time() - sent)
    return times


async def test_a_flood_into_a_stuck_session_is_held_back_and_the_others_stay_fast():
    frames = 2000
    async with serving(max_inbound_queue=_BOUND, max_messages_per_second=None) as gateway:
        store = _slow_store(gateway)
        async with session(gateway.url) as (flooder, created), session(gateway.url) as (other, _):
            driver, _, inbox = _server_side(gateway, created.session_id)
            store.held.add(created.session_id)
            flood = asyncio.create_task(_flood(flooder, frames))
            # The session is stuck: its queue fills, then the reader's, then it stops reading.
            await asyncio.wait_for(inbox.stalled.wait(), 10)
            stuck = await _round_trips(other, 20)
            store.released.set()  # the flooded session applies its backlog, a ping at a time
            busy = await _round_trips(other, 20)
            pongs = await flooder.recv_until(lambda e: isinstance(e, Pong) and e.ts == frames - 1)
            await flood
    assert inbox.peak == _BOUND  # reached, never passed
    assert driver.client_backlog_peak == _BOUND
    assert len(pongs) == frames  # every frame was answered: held back, none dropped
    assert max(stuck) < 0.25, stuck
    assert max(busy) < 0.25, busy


async def test_the_rate_limit_still_answers_and_closes_a_flood_held_back():
    async with serving(
        max_inbound_queue=_BOUND, max_messages_per_second=5, max_message_burst=20
    ) as gateway:
        store = _slow_store(gateway)
        async with session(gateway.url) as (flooder, created):
            _, _, inbox = _server_side(gateway, created.session_id)
            store.held.add(created.session_id)
            flood = asyncio.create_task(_flood(flooder, 500))
            await asyncio.wait_for(inbox.stalled.wait(), 10)
            store.released.set()
            events, closed = await _read_until_closed(flooder)
            flood.cancel()
            await asyncio.gather(flood, return_exceptions=True)
    refused = [e for e in events if isinstance(e, Error) and e.code == "rate_limited"]
    assert refused  # answered until the flood closed, though held back meanwhile
    assert [e.ts for e in events if isinstance(e, Pong)][:20] == list(range(20))
    assert closed.rcvd is not None
    assert (closed.rcvd.code, closed.rcvd.reason) == (1008, "message flood")
    assert inbox.peak <= _BOUND


async def test_a_socket_that_goes_while_its_reader_waits_for_room_leaves_its_session_resumable():
    async with serving(max_inbound_queue=_BOUND, max_messages_per_second=None) as gateway:
        store = _slow_store(gateway)
        async with session(gateway.url) as (flooder, created):
            driver, server_side, inbox = _server_side(gateway, created.session_id)
            store.held.add(created.session_id)
            await _flood(flooder, 200)
            await asyncio.wait_for(inbox.stalled.wait(), 10)
            flooder.websocket.transport.abort()  # gone while the reader waits for room
            store.released.set()
            await asyncio.wait_for(server_side.done.wait(), 10)
            await asyncio.wait_for(driver.detached.wait(), 10)  # the socket's task unwound
            await asyncio.wait_for(flooder.websocket.wait_closed(), 10)
        async with session(gateway.url):  # an unrelated socket still works too
            pass
        resume = SessionResume(
            session_id=created.session_id,
            resume_token=created.resume_token,
            last_seq=driver.session.last_seq,  # every pong was applied: nothing to replay
        )
        async with connect_raw(gateway.url) as conn:
            await conn.send(resume)
            resumed = await conn.recv()
    assert isinstance(resumed, SessionResumed)

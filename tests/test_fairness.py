"""A session that always has an event waiting still meets its deadlines."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from gateway.shell.driver import Driver
from gateway.wire.v1 import Ping, Pong, ServerMsg, ToolCalls, ToolStatus
from tests.support import say_until_calls, serving, session


class _BusyUntilExpired:
    """Keeps a session busy, and tells when a call's ``tool.status expired`` is sent.

    Every pong the session sends feeds it another ping while it is still applying the last
    one, so whenever the driver looks for its next event one is already waiting.
    """

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self.expired: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.stopped = False
        self._pings_left = 100_000
        """A bound, so that a regression fails the test instead of hanging the loop."""

    def started(self, now: float) -> None:
        pass

    def sent(self, msg: ServerMsg, now: float) -> None:
        if self.expired.done() or self.stopped:
            return
        if isinstance(msg, ToolStatus) and msg.status == "expired":
            self.expired.set_result(now)
        elif isinstance(msg, Pong) and self._pings_left:
            self._pings_left -= 1
            self._driver.feed(Ping())

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        pass

    def detached(self, *, ended: bool, now: float) -> None:
        pass

    def ended(self, now: float) -> None:
        pass


@pytest.mark.slow  # the busy spell: about 10 s on a 2-core machine
async def test_a_deadline_fires_on_time_while_events_never_stop_coming():
    async with serving() as gateway, session(gateway.url) as (conn, created):
        driver = gateway.runtime.drivers[created.session_id]
        busy = _BusyUntilExpired(driver)
        driver.add_observer(busy)
        calls: ToolCalls = await say_until_calls(conn, "slow")  # 0.3 s to answer
        driver.feed(Ping())  # from now on the session's queue is never empty
        expired_at = await asyncio.wait_for(busy.expired, 10)
        # The client hears it too, behind the pongs of the busy spell.
        await conn.recv_until(lambda e: isinstance(e, ToolStatus) and e.status == "expired")
    # Before, a passed deadline waited for the queue to empty: never, here.
    assert expired_at - calls.calls[0].deadline < 0.5


async def test_a_session_that_is_always_busy_leaves_the_others_their_turn():
    async with (
        serving() as gateway,
        session(gateway.url) as (conn, created),
        session(gateway.url) as (other, _),
    ):
        driver = gateway.runtime.drivers[created.session_id]
        busy = _BusyUntilExpired(driver)
        driver.add_observer(busy)
        driver.feed(Ping())  # busy from now on, until stopped
        loop = asyncio.get_running_loop()
        round_trips = []
        try:
            for i in range(20):
                sent = loop.time()
                await other.send(Ping(ts=float(i)))
                pong = await other.recv()
                assert isinstance(pong, Pong)
                round_trips.append(loop.time() - sent)
        finally:
            busy.stopped = True
        conn.websocket.transport.abort()  # its pongs were never read: drop, do not drain
    # Without handing the loop over, the other session's pings waited for ever.
    assert statistics.median(round_trips) < 0.05, round_trips

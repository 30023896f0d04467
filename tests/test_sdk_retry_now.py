"""``Conversation.retry_now()``: the app cuts the wait between two reconnect attempts short
(the network is back, the user clicked "Retry now"). The next attempt starts at once, the
backoff keeps growing, no second series of attempts starts, the conversation goes on: first
with a fake socket opener, then against a real gateway through a proxy that refuses the
attempts while "down". The JS SDK's ``retryNow()`` has the same tests (its own file)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
from websockets.asyncio.client import ClientConnection

from client_sdk import SessionClosed, connect, resume
from client_sdk.resume import Reconnector
from gateway.wire.v1 import Outbound, ResponseCreated, ResponseDone, SessionResumed, TextDelta
from tests.proxy import Proxy, proxy_to
from tests.support import Gateway, serving


class Pauses:
    """The waits between two attempts the SDK began (a spy on ``Reconnector._pause``): when
    each began (the loop's clock) and how long it was to last."""

    def __init__(self) -> None:
        self.begun: list[tuple[float, float]] = []
        self._changed = asyncio.Event()

    @property
    def seconds(self) -> list[float]:
        return [seconds for _, seconds in self.begun]

    def add(self, seconds: float) -> None:
        self.begun.append((asyncio.get_running_loop().time(), seconds))
        self._changed.set()

    async def wait_for(self, count: int, within: float = 10.0) -> None:
        """Until ``count`` waits began: the SDK waits now, once the last attempt failed."""
        async with asyncio.timeout(within):
            while len(self.begun) < count:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> Pauses:
    seen = Pauses()
    pause = Reconnector._pause

    async def spied(self: Reconnector, seconds: float) -> None:
        seen.add(seconds)
        await pause(self, seconds)  # the real wait: retry_now() must end it

    monkeypatch.setattr(Reconnector, "_pause", spied)
    return seen


class Opener:
    """Opens fake sockets: refuses them (``ConnectionRefusedError``) while ``up`` is false."""

    def __init__(self) -> None:
        self.up = False
        self.attempts = 0
        self.socket = cast(ClientConnection, object())

    async def __call__(self, session_id: str | None) -> ClientConnection:
        self.attempts += 1
        if not self.up:
            raise ConnectionRefusedError("the network is down")
        return self.socket


async def test_retry_now_starts_the_next_attempt_at_once_and_the_backoff_keeps_growing(
    pauses: Pauses, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resume, "FIRST_DELAY", 30.0)  # no wait ends by itself within the test
    opener = Opener()
    reconnector = Reconnector(opener, max_delay=600.0)
    assert reconnector.retry_now() is False  # nothing started
    dialing = asyncio.create_task(reconnector.dial())
    await pauses.wait_for(1)
    assert opener.attempts == 1
    assert reconnector.retry_now() is True
    assert reconnector.retry_now() is False  # cut short already: the attempt is on its way
    await pauses.wait_for(2)  # it failed too: the SDK waits again
    assert opener.attempts == 2
    opener.up = True
    assert reconnector.retry_now() is True
    async with asyncio.timeout(5):
        assert await dialing is opener.socket
    assert opener.attempts == 3  # one attempt per retry_now(): never a second loop
    assert reconnector.retry_now() is False  # nothing waits
    # 50-100 % of 30 s, then of 60 s: the wait after a failed retry grew as it would have.
    first, second = pauses.seconds
    assert 15 <= first <= 30
    assert 30 <= second <= 60


async def test_retry_now_is_false_during_an_attempt_and_after_stop(pauses: Pauses) -> None:
    dialed, release = asyncio.Event(), asyncio.Event()

    async def slow_refusal(session_id: str | None) -> ClientConnection:
        dialed.set()
        await release.wait()
        raise ConnectionRefusedError("the network is down")

    reconnector = Reconnector(slow_refusal, max_delay=600.0)
    dialing = asyncio.create_task(reconnector.dial())
    await asyncio.wait_for(dialed.wait(), 5)
    assert reconnector.retry_now() is False  # an attempt in flight
    release.set()
    await pauses.wait_for(1)
    reconnector.stop()
    assert reconnector.retry_now() is False  # stopped: no attempt comes
    async with asyncio.timeout(5):
        assert await dialing is None


async def test_retry_now_leaves_the_give_up_count_running(
    pauses: Pauses, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resume, "FIRST_DELAY", 30.0)
    opener = Opener()
    reconnector = Reconnector(opener, max_delay=600.0, give_up_after=0.1)
    dialing = asyncio.create_task(reconnector.dial())
    async with asyncio.timeout(10):
        while not dialing.done():  # retry at every wait: each attempt still counts as failed
            waiting = asyncio.ensure_future(pauses.wait_for(len(pauses.begun) + 1))
            await asyncio.wait({dialing, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if not dialing.done():
                assert reconnector.retry_now() is True
        outcome = dialing.result()
    assert isinstance(outcome, SessionClosed)
    assert (outcome.closed_with, outcome.reason) == (1006, "could not reach the gateway for 0.1 s")
    assert opener.attempts == len(pauses.begun) + 1 > 2  # no wait after the last one


# ----------------------------------------------------------------- against a real gateway


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with serving(first_message_timeout=60) as running:
        yield running


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[Proxy]:
    async with proxy_to(gateway.port) as running:
        yield running


async def reply_to(events: AsyncIterator[Outbound], msg_id: str) -> tuple[str, list[Outbound]]:
    """The text of the response to ``msg_id``, and every event up to its end."""
    seen: list[Outbound] = []
    response_id: str | None = None
    async with asyncio.timeout(10):
        async for event in events:
            seen.append(event)
            if isinstance(event, ResponseCreated) and event.in_reply_to == msg_id:
                response_id = event.response_id
            if isinstance(event, ResponseDone) and event.response_id == response_id:
                text = [e.delta for e in seen if isinstance(e, TextDelta)]
                return "".join(text), seen
    raise AssertionError("the events ended before the reply")


REFUSED = 6
"""Attempts the proxy refuses before the network comes back: the SDK then waits 50-100 % of
1.6 s (50 ms, doubling), much longer than a resume over loopback takes."""


async def test_retry_now_resumes_at_once_through_a_real_gateway(
    pauses: Pauses, proxy: Proxy
) -> None:
    async with connect(proxy.url(), max_reconnect_delay=60.0) as conv:
        before = "".join([d async for d in conv.say("echo before the drop")])
        events = conv.events()
        assert conv.retry_now() is False  # connected
        proxy.upgrades = ["reset"] * 1000  # down: every new connection is reset
        dialed = proxy.accepted
        proxy.drop()
        # The proxy refuses attempts until the backoff has grown.
        await proxy.wait_until(lambda: proxy.accepted == dialed + REFUSED)
        await pauses.wait_for(REFUSED)  # the last one failed too: the SDK waits now
        assert proxy.accepted == dialed + REFUSED
        away = await conv.post("echo while away")  # no socket: kept, sent again after the resume
        proxy.upgrades.clear()  # the network is back
        loop = asyncio.get_running_loop()
        began, seconds = pauses.begun[-1]
        assert conv.retry_now() is True
        assert isinstance(await anext(events), SessionResumed)  # nothing came while away
        resumed_at = loop.time()
        text, seen = await reply_to(events, away)
        after = "".join([d async for d in conv.say("echo after")])
        assert conv.reconnects == 1
        assert proxy.accepted == dialed + REFUSED + 1  # one attempt: no second loop
    assert resumed_at < began + seconds  # before the wait would have ended by itself
    assert len(pauses.begun) == REFUSED
    assert (before, text, after) == ("before the drop", "while away", "after")
    replies = [e for e in seen if isinstance(e, ResponseCreated) and e.in_reply_to == away]
    assert len(replies) == 1  # answered once
    seqs = [e.seq for e in seen if e.seq]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no gap, no duplicate

"""``session.going_away``: the gateway tells a socket before it closes it for its own
reasons, and the shipped Python SDK moves to a new socket ahead of the close, so the
conversation loses nothing and repeats nothing. Here on one node (``max_socket_age``, a
shutdown); the rolling restart of a Redis cluster is tests/test_rolling_restart.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import websockets

from client_sdk import connect, connect_raw
from client_sdk.framing import Protocol
from gateway.agent.file import DEMO_AGENT
from gateway.errors import CloseCode
from gateway.wire.v1 import (
    FIRST_DEVICE,
    ResponseDone,
    ServerMsg,
    SessionCreated,
    SessionGoingAway,
    SessionResumed,
    SessionStart,
    TextDelta,
)
from tests.support import record, serving

WAIT = 10.0
LONG_ANSWER_PROMPT = "tell me something"
"""The demo agent's fallback: a long answer (~50 words at the demo's pace: over a second)."""


def no_duplicate_no_gap(events: Sequence[ServerMsg]) -> None:
    numbers = [e.seq for e in events if e.seq]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers


@pytest.fixture
async def aging() -> AsyncIterator[str]:
    """A gateway whose sockets live 1.2 s, told 0.8 s ahead."""
    async with serving(agent=str(DEMO_AGENT), max_socket_age=1.2, going_away_notice=0.8) as gateway:
        yield gateway.url


@pytest.mark.parametrize("protocol", ["json", "msgpack"])
async def test_the_sdk_moves_to_a_new_socket_before_the_old_one_ages_out(
    aging: str, protocol: Protocol
) -> None:
    async with connect(aging, protocol=protocol) as conv:
        seen = record(conv)
        await conv.start()
        first_socket = conv._ws
        await seen.until(lambda s: any(isinstance(e, SessionResumed) for e in s))
        notice = next(e for e in seen.events if isinstance(e, SessionGoingAway))
        assert (notice.reason, notice.time_left) == ("max_socket_age", 0.8)
        resumed = next(e for e in seen.events if isinstance(e, SessionResumed))
        assert resumed.device_id == FIRST_DEVICE
        assert conv._ws is not first_socket
        assert conv.reconnects == 1
        # The conversation goes on over the new socket.
        reply = "".join([d async for d in conv.say("hello there")])
        assert reply.startswith("Hello!")
        no_duplicate_no_gap(seen.events)
        seen.stop()


async def test_an_answer_streaming_across_the_move_arrives_whole_once(aging: str) -> None:
    async with connect(aging) as conv:
        seen = record(conv)
        async with asyncio.timeout(WAIT):
            answer = "".join([d async for d in conv.say(LONG_ANSWER_PROMPT)])
        assert answer.startswith("I'm the demo assistant")
        assert answer.endswith('1234?"')
        # The move came while the answer streamed (1.6 s at the demo's pace): seen whole.
        await seen.until(lambda s: any(isinstance(e, ResponseDone) for e in s))
        assert any(isinstance(e, SessionGoingAway) for e in seen.events)
        assert "".join(e.delta for e in seen.events if isinstance(e, TextDelta)) == answer
        no_duplicate_no_gap(seen.events)
        seen.stop()


async def test_a_client_that_does_not_move_is_closed_with_1013_at_the_age(aging: str) -> None:
    async with connect_raw(aging) as raw:
        await raw.send(SessionStart())
        assert isinstance(await raw.recv(), SessionCreated)
        notice = await raw.recv(within=WAIT)
        assert isinstance(notice, SessionGoingAway)
        assert notice.seq == 0
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await raw.recv(within=WAIT)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == CloseCode.TRY_AGAIN
        assert closed.value.rcvd.reason == "socket reached its maximum age: resume"


async def test_a_device_that_moves_leaves_the_other_devices_attached(aging: str) -> None:
    async with connect(aging) as phone:
        created = await phone.start()
        async with connect(aging, join=(created.session_id, created.resume_token)) as laptop:
            laptop_seen = record(laptop)
            phone_seen = record(phone)
            await laptop.start()
            await phone_seen.until(lambda s: any(isinstance(e, SessionResumed) for e in s))
            await laptop_seen.until(lambda s: any(isinstance(e, SessionResumed) for e in s))
            # Each moved as itself: neither took the session from the other.
            reply = "".join([d async for d in phone.say("hello there")])
            await laptop_seen.until(
                lambda s: "".join(e.delta for e in s if isinstance(e, TextDelta)) == reply,
            )
            assert phone.reconnects >= 1
            assert laptop.reconnects >= 1
            no_duplicate_no_gap(laptop_seen.events)
            laptop_seen.stop()
            phone_seen.stop()


async def test_a_shutdown_tells_the_socket_before_closing_it() -> None:
    async with serving(agent=str(DEMO_AGENT)) as gateway, connect_raw(gateway.url) as raw:
        await raw.send(SessionStart())
        assert isinstance(await raw.recv(), SessionCreated)
        stopping = asyncio.create_task(gateway.runtime.shutdown(grace=5.0))
        notice = await raw.recv(within=WAIT)
        assert isinstance(notice, SessionGoingAway)
        assert (notice.reason, notice.time_left) == ("shutdown", 0.0)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await raw.recv(within=WAIT)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == CloseCode.SERVICE_RESTART
        await stopping

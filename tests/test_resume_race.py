"""A resume racing the session's TTL always gets an answer: resumed, or 4008.

Slow (two stores, 300 races each): ``make test-fast`` leaves it out.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

from client_sdk import connect_raw
from gateway.wire.v1 import ResponseDone, SessionResume, SessionResumed, UserMessage
from tests.data.tools import reset_gates
from tests.redis_server import redis_server
from tests.support import Gateway, serving, session

pytestmark = pytest.mark.slow

_TTL = 0.3
_SPREAD = 0.05
"""Resumes land up to this many seconds before or after the TTL runs out."""
_ATTEMPTS = 300
_BATCH = 10
"""Attempts at once: more, and their own load delays the resumes past the moment they aim
at (on Redis each one is a few store round trips), so the race is no longer run."""
_ANSWER_WITHIN = 10.0
"""A sanity bound, not a speed target: ten times the 1 s this test once allowed. An answer
takes milliseconds (bench/resume_race.py prints the figures); what the test catches is
silence, a resume that is never answered."""


async def _resume_at_the_deadline(gateway: Gateway, attempt: int, offset: float) -> object:
    """Start a session with an async tool pending, drop it, and resume ``offset`` seconds
    from when its TTL runs out; the answer: ``resumed``, or the close code and reason."""
    loop = asyncio.get_running_loop()
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text=f"order r{attempt}"))  # its gate never opens
        await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        driver = gateway.runtime.drivers[created.session_id]
        conn.websocket.transport.abort()
        await asyncio.wait_for(driver.detached.wait(), 5)
    # The TTL counts from the moment the session saw its socket go, on its own clock (the
    # wall clock); a loaded machine only delays when this task learns of it.
    assert driver.detached_since is not None
    detached_at = driver.detached_since - time.time() + loop.time()
    async with connect_raw(gateway.url) as fresh:  # connected before the moment that counts
        resume = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=created.seq
        )
        await asyncio.sleep(max(0.0, detached_at + _TTL + offset - loop.time()))
        await fresh.send(resume)
        try:
            answer = await fresh.recv(within=_ANSWER_WITHIN)  # silence raises TimeoutError
        except websockets.ConnectionClosed as closed:
            return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else "no close frame"
        return "resumed" if isinstance(answer, SessionResumed) else answer
        # leaving: the normal close ends a resumed session


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each store: this process's memory, and a real redis-server."""
    if request.param == "memory":
        yield "memory"
        return
    with redis_server(tmp_path) as server:
        yield server.url


async def test_a_resume_racing_the_ttl_is_resumed_or_refused_with_4008_never_silence(store):
    reset_gates()
    rng = random.Random(11)
    answers: list[object] = []
    async with serving(session_ttl=_TTL, max_sockets_per_ip=None, store=store) as gateway:
        for first in range(0, _ATTEMPTS, _BATCH):
            answers += await asyncio.gather(
                *(
                    _resume_at_the_deadline(gateway, i, rng.uniform(-_SPREAD, _SPREAD))
                    for i in range(first, first + _BATCH)
                )
            )
        await asyncio.wait_for(gateway.runtime.idle.wait(), 5)
    expired = (4008, "session ended or expired")
    assert [a for a in answers if a not in ("resumed", expired)] == []
    # Both sides of the race were run, so the answers cover the moment the TTL runs out.
    assert answers.count("resumed") > 0
    assert answers.count(expired) > 0
    assert len(answers) == _ATTEMPTS

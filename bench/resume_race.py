"""How long a resume that races the session's TTL waits for its answer.

The race of tests/test_resume_race.py, timed: a session with an async tool pending loses its
socket, and a resume lands within 50 ms either side of the moment its TTL (0.3 s) runs out,
ten at a time, on each store (this process's memory, and a real redis-server). From sending
``session.resume`` to its answer (``session.resumed`` or the close 4008), per store and
answer. The gateway runs in this process, client and server sharing one event loop. Prints
figures; asserts nothing (the test checks that every resume is answered, with a sanity bound
ten times these figures).

    .venv/bin/python -m bench.resume_race [attempts]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import websockets

from client_sdk import connect_raw
from gateway.logging import configure_logging
from gateway.wire.v1 import ResponseDone, SessionResume, SessionResumed, UserMessage
from tests.data.tools import reset_gates
from tests.redis_server import redis_server
from tests.support import Gateway, serving, session

__all__: list[str] = []

TTL = 0.3
SPREAD = 0.05
BATCH = 10


async def _race(gateway: Gateway, attempt: int, offset: float) -> tuple[str, float]:
    """The answer to a resume ``offset`` s from the TTL's end, and how long it took."""
    loop = asyncio.get_running_loop()
    async with session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text=f"order r{attempt}"))  # its gate never opens
        await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        driver = gateway.runtime.drivers[created.session_id]
        conn.websocket.transport.abort()
        await asyncio.wait_for(driver.detached.wait(), 30)
    assert driver.detached_since is not None
    detached_at = driver.detached_since - time.time() + loop.time()
    async with connect_raw(gateway.url) as fresh:
        resume = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=created.seq
        )
        await asyncio.sleep(max(0.0, detached_at + TTL + offset - loop.time()))
        sent = loop.time()
        await fresh.send(resume)
        try:
            answer = await fresh.recv(within=60)
        except websockets.ConnectionClosed:
            return "refused", loop.time() - sent
        return ("resumed" if isinstance(answer, SessionResumed) else "other"), loop.time() - sent


async def _store(name: str, store: str, attempts: int) -> None:
    reset_gates()
    rng = random.Random(11)
    answers: list[tuple[str, float]] = []
    async with serving(session_ttl=TTL, max_sockets_per_ip=None, store=store) as gateway:
        for first in range(0, attempts, BATCH):
            answers += await asyncio.gather(
                *(
                    _race(gateway, i, rng.uniform(-SPREAD, SPREAD))
                    for i in range(first, first + BATCH)
                )
            )
    for kind in ("resumed", "refused", "other"):
        took = [t for k, t in answers if k == kind]
        if took:
            print(
                f"{name:<7} {kind:<8} n={len(took):<4} p50 {statistics.median(took) * 1000:7.1f}"
                f" ms  max {max(took) * 1000:7.1f} ms"
            )


async def main(attempts: int) -> None:
    await _store("memory", "memory", attempts)
    with tempfile.TemporaryDirectory() as directory, redis_server(Path(directory)) as server:
        await _store("redis", server.url, attempts)


if __name__ == "__main__":
    configure_logging("error")
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))

"""What a costly frame or a flood costs the other sessions: their ping round trips meanwhile.

Runs the gateway in-process on a free port with the test agent; client and server share one
event loop and one core (figures include both ends). For each case, one session sends a
``session.update`` while another pings one ping at a time until the update is answered.
Prints the time to the answer, the victim's round trips and how many of its pongs came
before the answer. Then one session streams 150 words (4 ms apart) and pings every 10
deltas while other sessions flood (ten pipelined pings at a time) until each is closed:
the streamer's round trips and the floods closed meanwhile. Asserts nothing: these are the
figures tests/test_frame_limits.py once asserted; it now checks the order of events, with
sanity bounds ten times these.

    .venv/bin/python -m bench.frame_limits
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from typing import Any

import websockets

from client_sdk import Connection
from gateway.logging import configure_logging
from gateway.shell.schema_worker import SchemaWorker
from tests.support import running_gateway, session

__all__: list[str] = []


def _frame(schema: dict[str, Any], functions: int = 1) -> str:
    declared = [
        {"name": f"f_{n}", "description": "d", "input_schema": schema} for n in range(functions)
    ]
    return json.dumps({"type": "session.update", "client_functions": declared})


def _at_limit(salt: int) -> dict[str, Any]:
    # 500 nodes of empty subschemas, made distinct so the cache does not answer.
    return {"type": "object", "allOf": [{}] * 496 + [{"title": f"v{salt}"}]}


CASES: list[tuple[str, Any]] = [
    ("costly allOf 40k (refused)", lambda n: {"type": "object", "allOf": [{}] * 40_000}),
    ("100 deep (refused)", lambda n: _deep(100)),
    ("500 nodes, new (checked)", _at_limit),
]


def _deep(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


async def _measure(
    victim: Connection, client: Connection, frame: str, frame_kind: str
) -> tuple[float, list[float], int]:
    """The time to the answer, the victim's round trips, its pongs before the answer."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await client.send_raw(frame)
    answer = asyncio.ensure_future(client.recv(within=120))
    took = 0.0
    rtts = []
    meanwhile = 0
    while True:
        sent = loop.time()
        await victim.send_raw(json.dumps({"type": "ping"}))
        await victim.recv(within=120)
        rtts.append(loop.time() - sent)
        if answer.done():
            took = took or loop.time() - started
            break
        meanwhile += 1
    kind = type(await answer).__name__
    assert kind == ("SessionUpdated" if "checked" in frame_kind else "Error"), kind
    return took, rtts, meanwhile


async def main() -> None:
    for offload in (True, False):
        async with running_gateway() as url:
            if not offload:
                SchemaWorker.check = _no_offload  # type: ignore[method-assign]
            async with session(url) as (victim, _), session(url) as (client, _):
                for name, build in CASES:
                    samples = [
                        await _measure(victim, client, _frame(build(n)), name) for n in range(5)
                    ]
                    took = statistics.median(t for t, _, _ in samples)
                    rtts = [r for _, rs, _ in samples for r in rs]
                    meanwhile = min(m for _, _, m in samples)
                    where = "worker" if offload else "event loop"
                    print(
                        f"{name:<28} check on {where:<13} answer p50 {took * 1000:7.1f} ms"
                        f"  victim ping n={len(rtts):<5} p50 {statistics.median(rtts) * 1000:6.1f}"
                        f" ms  max {max(rtts) * 1000:6.1f} ms"
                        f"  pongs before the answer (fewest) {meanwhile}"
                    )
    SchemaWorker.check = _ORIGINAL  # type: ignore[method-assign]
    await _floods()


async def _floods(runs: int = 5) -> None:
    """The streamer's round trips while flooding sessions are refused and closed."""
    words = " ".join(f"w{i}" for i in range(150))
    limits = {"max_messages_per_second": 50.0, "max_message_burst": 20}
    rtts: list[float] = []
    closed: list[int] = []
    async with running_gateway(scripted_pace=0.004, **limits) as url:
        for _ in range(runs):
            async with session(url) as (streamer, _):
                await streamer.send_raw(
                    json.dumps({"type": "user.message", "text": f"echo {words}"})
                )
                stop = asyncio.Event()
                floods: list[None] = []
                flooding = asyncio.create_task(_keep_flooding(url, stop, floods))
                rtts += await _stream_and_ping(streamer)
                closed.append(len(floods))
                stop.set()
                await flooding
    print(
        f"{'streaming beside floods':<28} streamer ping n={len(rtts):<4}"
        f" p50 {statistics.median(rtts) * 1000:6.1f} ms  max {max(rtts) * 1000:6.1f} ms"
        f"  floods closed per stream (fewest) {min(closed)}"
    )


async def _stream_and_ping(streamer: Connection) -> list[float]:
    """Ping after every 10 events until ``response.done``; the round trips."""
    loop = asyncio.get_running_loop()
    rtts: list[float] = []
    while True:
        sent = loop.time()
        await streamer.send_raw(json.dumps({"type": "ping"}))
        while (kind := type(await streamer.recv(within=120)).__name__) not in (
            "Pong",
            "ResponseDone",
        ):
            pass
        if kind == "ResponseDone":
            return rtts
        rtts.append(loop.time() - sent)
        for _ in range(10):
            if type(await streamer.recv(within=120)).__name__ == "ResponseDone":
                return rtts


async def _keep_flooding(url: str, stop: asyncio.Event, floods: list[None]) -> None:
    while not stop.is_set():
        async with session(url) as (conn, _):
            sent = 0
            with contextlib.suppress(websockets.ConnectionClosed):
                reader = asyncio.ensure_future(_read_all(conn))
                while not reader.done():
                    for _ in range(10):
                        await conn.send_raw(json.dumps({"type": "ping", "id": f"f{sent}"}))
                        sent += 1
                    await asyncio.sleep(0)
                await reader
            floods.append(None)


async def _read_all(conn: Connection) -> None:
    while True:
        await conn.recv()


_ORIGINAL = SchemaWorker.check


async def _no_offload(self: SchemaWorker, schemas: list[dict[str, Any]]) -> None:
    """The core checks new schemas itself, on the event loop (as before the worker)."""


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())

"""Turn latency over a real socket: user.message -> response.done, and per text.delta cost.

Runs the gateway in-process on a free port with the test agent (scripted model,
pace 0) and the real client connection; client and server share one event loop
and one core, so a figure is the cost of both ends. The history grows over a
series, as in a real conversation. Prints figures; asserts nothing.

    .venv/bin/python -m bench.turn_latency [turns]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from gateway.logging import configure_logging
from gateway.wire.v1 import ResponseDone, TextDelta, ToolResult, ToolResults
from tests.support import running_gateway, say, say_until_calls, session

__all__: list[str] = []

WORDS = 50


def _summary(name: str, samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return (
        f"{name:<34} n={len(samples):<5} p50={statistics.median(samples) * 1000:7.3f} ms"
        f"  p99={p99 * 1000:7.3f} ms"
    )


async def main(turns: int) -> None:
    text = "echo " + " ".join(f"w{i}" for i in range(WORDS))
    async with running_gateway() as url:
        for _ in range(20):  # warm up
            async with session(url) as (conn, _):
                await say(conn, "echo warm up")
        echo = await _text_turns(url, text, turns)
        round_trip = await _client_function_turns(url, turns)
    print(f"python {sys.version.split()[0]}, {turns} turns each in one session, loopback")
    print(_summary(f"text turn ({WORDS} deltas)", echo))
    per_event = [t / (WORDS + 3) for t in echo]  # the deltas, response.created/text.done/done
    print(_summary("  per server event", per_event))
    print(_summary("client-function turn (2 steps)", round_trip))


async def _text_turns(url: str, text: str, turns: int) -> list[float]:
    echo: list[float] = []
    async with session(url) as (conn, _):
        for _ in range(turns):
            started = time.perf_counter()
            events = await say(conn, text)
            echo.append(time.perf_counter() - started)
            assert sum(isinstance(e, TextDelta) for e in events) == WORDS
    return echo


async def _client_function_turns(url: str, turns: int) -> list[float]:
    round_trip: list[float] = []
    async with session(url) as (conn, _):
        for _ in range(turns):
            started = time.perf_counter()
            calls = await say_until_calls(conn, "one")
            call = calls.calls[0]
            result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "v"})
            await conn.send(ToolResults(results=[result]))
            await conn.recv_until(lambda e: isinstance(e, ResponseDone))
            round_trip.append(time.perf_counter() - started)
    return round_trip


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))

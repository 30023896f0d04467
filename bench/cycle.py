"""The client-function cycle through a real gateway process, and its ping round trip.

`gateway serve` runs as a process of its own (memory store, no auth, warnings only) on
CPU 0 with a bench agent whose scripted model answers ``battery`` with a call of the
client function ``get_battery_level`` and, once the result is back, a short sentence. The
load generator is this process, on CPU 1, with a minimal RFC 6455 client (bench/ws_client.py)
that stamps each frame when its bytes arrive. One session; after a warm-up, N sequential
cycles, each:

    user.message -> tool.calls (t0) -> tool.results, same call id -> first text.delta (t1)
    -> response.done

The cycle is t1 - t0: the result sent, the model's next step, its first word back. In
the same run, in alternating blocks, N sequential v1 ``ping``/``pong`` round trips. The
gateway's CPU time (from /proc) is read around the cycle blocks. Prints figures; asserts
nothing.

    .venv/bin/python -m bench.cycle [--cycles 5000] [--warmup 500] [--timeout 600]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from bench.figure import us_line
from bench.server_process import (
    CLIENT_CPU,
    SERVER_CPU,
    OtherLoad,
    cpu_seconds,
    gateway,
    machine,
    pin_self,
    placement,
    profiled,
    self_cpu_seconds,
)
from bench.ws_client import WebSocket, connect

__all__: list[str] = []

BLOCK = 100
"""Cycles (then as many pings) per block: the two alternate, so they share the conditions."""
ACK_EVERY = 10
"""Turns between acks (about 60 events, as the SDK's every 64), sent after response.done."""

SCENARIO = """\
pace = 0.0
fallback = "?"

[[rules]]
match = '^battery$'
pace = 0.0
calls = [{ tool = "get_battery_level" }]

[[results]]
tool = "get_battery_level"
say = "The battery is at {output.level} percent."
"""
AGENT = """\
name = "bench-cycle"
instructions = "Answer briefly."

[model]
provider = "scripted"
scenario = "scenario.toml"

[[client_functions]]
name = "get_battery_level"
description = "The device's battery level, in percent."
input_schema = { type = "object", properties = {}, additionalProperties = false }
"""


class _Call(msgspec.Struct):
    call_id: str


class _Calls(msgspec.Struct):
    calls: list[_Call]


class _Seq(msgspec.Struct):
    seq: int = 0


_decode_calls = msgspec.json.Decoder(_Calls).decode
_decode_seq = msgspec.json.Decoder(_Seq).decode
_encode = msgspec.json.encode
USER_MESSAGE = _encode({"type": "user.message", "text": "battery"})
PING = _encode({"type": "ping"})


def _results(call_id: str) -> bytes:
    result = {"call_id": call_id, "tool": "get_battery_level", "output": {"level": 80}}
    return _encode({"type": "tool.results", "results": [result]})


@dataclass
class Figures:
    cycles: list[float] = field(default_factory=list)
    turns: list[float] = field(default_factory=list)
    pings: list[float] = field(default_factory=list)
    cycle_wall: float = 0.0
    cycle_server_cpu: float = 0.0
    cycle_client_cpu: float = 0.0
    ping_wall: float = 0.0
    ping_server_cpu: float = 0.0
    others: float = 0.0
    """Per cent of one core other processes used during the timed part."""


async def _cycle(ws: WebSocket) -> tuple[float, float, int]:
    """One turn; (cycle t1 - t0, whole turn, seq of its response.done)."""
    started = time.perf_counter()
    ws.send(USER_MESSAGE)
    t0, calls = await ws.recv_type("tool.calls")
    ws.send(_results(_decode_calls(calls).calls[0].call_id))
    t1, _ = await ws.recv_type("text.delta")
    t2, done = await ws.recv_type("response.done")
    return t1 - t0, t2 - started, _decode_seq(done).seq


async def _ping(ws: WebSocket) -> float:
    started = time.perf_counter()
    ws.send(PING)
    arrived, _ = await ws.recv_type("pong")
    return arrived - started


async def _cycles(ws: WebSocket, count: int, turn: list[int], out: Figures | None) -> None:
    for _ in range(count):
        cycle, whole, seq = await _cycle(ws)
        turn[0] += 1
        if turn[0] % ACK_EVERY == 0:
            ws.send(_encode({"type": "ack", "seq": seq}))
        if out is not None:
            out.cycles.append(cycle)
            out.turns.append(whole)


async def run(url: str, pid: int, count: int, warmup: int, profile: Path | None) -> Figures:
    figures = Figures()
    ws = await connect(url)
    try:
        ws.send(_encode({"type": "session.start"}))
        await ws.recv_type("session.created")
        turn = [0]
        await _cycles(ws, warmup, turn, None)
        for _ in range(warmup):
            await _ping(ws)
        others = OtherLoad(pid)
        with profiled(pid, profile):
            others.start()
            await _timed(ws, pid, count, turn, figures)
            figures.others = others.percent()
    finally:
        await ws.close()
    return figures


async def _timed(ws: WebSocket, pid: int, count: int, turn: list[int], figures: Figures) -> None:
    done = 0
    while done < count:
        block = min(BLOCK, count - done)
        cpu0, client0, wall0 = cpu_seconds(pid), self_cpu_seconds(), time.perf_counter()
        await _cycles(ws, block, turn, figures)
        wall1, cpu1 = time.perf_counter(), cpu_seconds(pid)
        figures.cycle_wall += wall1 - wall0
        figures.cycle_server_cpu += cpu1 - cpu0
        figures.cycle_client_cpu += self_cpu_seconds() - client0
        for _ in range(block):
            figures.pings.append(await _ping(ws))
        figures.ping_wall += time.perf_counter() - wall1
        figures.ping_server_cpu += cpu_seconds(pid) - cpu1
        done += block


def report(figures: Figures) -> None:
    print(us_line("client-function cycle (tool.calls -> 1st delta)", figures.cycles))
    print(us_line("  whole turn (user.message -> response.done)", figures.turns))
    tenth = max(1, len(figures.turns) // 10)
    print(
        f"{'  p50 of the first / last tenth':<44} cycle "
        f"{statistics.median(figures.cycles[:tenth]) * 1e6:.0f} / "
        f"{statistics.median(figures.cycles[-tenth:]) * 1e6:.0f} µs, whole turn "
        f"{statistics.median(figures.turns[:tenth]) * 1e6:.0f} / "
        f"{statistics.median(figures.turns[-tenth:]) * 1e6:.0f} µs (the history grows)"
    )
    print(us_line("ping round trip", figures.pings))
    turns, wall = len(figures.turns), figures.cycle_wall
    print(
        f"during the cycles: gateway CPU {figures.cycle_server_cpu / wall * 100:.0f} % of one "
        f"core ({figures.cycle_server_cpu / turns * 1e6:.0f} µs per turn), load generator "
        f"{figures.cycle_client_cpu / wall * 100:.0f} %, {turns / wall:,.0f} turns/s"
    )
    print(
        f"during the pings: gateway CPU {figures.ping_server_cpu / figures.ping_wall * 100:.0f} %"
        f" ({figures.ping_server_cpu / len(figures.pings) * 1e6:.0f} µs per ping)"
    )
    print(f"other processes meanwhile: {figures.others:.0f} % of one core (noise if not ~0)")


def _bounded(factory: Callable[[], Coroutine[Any, Any, Figures]], timeout: float) -> Figures:
    async def bounded() -> Figures:
        async with asyncio.timeout(timeout):
            return await factory()

    return uvloop.run(bounded())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cycles", type=int, default=5_000, help="timed cycles (and pings)")
    parser.add_argument("--warmup", type=int, default=500, help="untimed cycles and pings first")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the run, s")
    parser.add_argument(
        "--profile", type=Path, help="write a py-spy profile of the gateway (timed part) here"
    )
    args = parser.parse_args()
    pin_self()
    where = placement(gateway=SERVER_CPU, load_generator=CLIENT_CPU)
    print(f"# bench.cycle: {machine()}; {where}")
    with tempfile.TemporaryDirectory(prefix="bench-cycle-") as folder:
        agent = Path(folder) / "agent.toml"
        (Path(folder) / "scenario.toml").write_text(SCENARIO)
        agent.write_text(AGENT)
        with gateway(agent) as server:
            url = f"ws://127.0.0.1:{server.port}/v1/realtime"
            figures = _bounded(
                lambda: run(url, server.pid, args.cycles, args.warmup, args.profile), args.timeout
            )
    report(figures)


if __name__ == "__main__":
    main()

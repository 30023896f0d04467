"""What the gateway adds to a model's stream: first delta and total, direct and through it.

An llmock server (the test suite's mock of the OpenAI API) runs as a process of its own,
scripted to answer every request with the same text of N words, streamed as one
``chat.completion.chunk`` per word with no delay. R rounds of each, interleaved (direct,
gateway, direct, ...), after a warm-up:

- direct: an httpx client (one pooled connection, as the gateway has) posts the request
  the gateway would send and reads the stream: from sending it to the first content delta,
  and to the end of the stream;
- through the gateway: `gateway serve` (memory store, no auth, warnings only) with an
  agent whose model is the ``openai`` provider at llmock's base URL; a new session per
  round (the history stays one message, as in the direct request), from sending
  ``user.message`` to the first ``text.delta``, and to ``response.done``.

The gateway runs on CPU 0, llmock on CPU 1. Every round reads from CPU 0 (``--direct-cpu``):
the direct reader there (the gateway is idle meanwhile), and in the gateway's rounds the
WebSocket client, beside the gateway. So llmock has its core to itself in both, and the
consumer side of the stream is on the other: the direct reader alone, or the gateway and
its client. (The client used to read from llmock's core, where its CPU slowed llmock down
in the gateway's rounds only.) Prints figures; asserts nothing.

    .venv/bin/python -m bench.upstream [--words 200] [--rounds 200] [--warmup 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import uvloop

from bench.figure import percentile
from bench.server_process import (
    CLIENT_CPU,
    SERVER_CPU,
    OtherLoad,
    Server,
    cpu_seconds,
    gateway,
    machine,
    pin_self,
    pinning,
    placement,
    self_cpu_seconds,
    server,
)
from bench.ws_client import connect, frame_type

__all__: list[str] = []

MODEL = "bench"
INSTRUCTIONS = "Answer briefly."
USER_TEXT = "Tell me a story."
API_KEY = "bench-not-a-key"
AGENT = """\
name = "bench-upstream"
instructions = "{instructions}"

[model]
provider = "openai"
model = "{model}"
base_url = "{base_url}"
api_key_env = "BENCH_UPSTREAM_KEY"
"""


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta = msgspec.field(default_factory=_Delta)


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_encode = msgspec.json.encode


@dataclass
class Round:
    first: float
    """Seconds from the request to the first text."""
    total: float
    """Seconds from the request to the end of the stream (``response.done``)."""
    deltas: int


@dataclass
class Rounds:
    direct: list[Round] = field(default_factory=list)
    gateway: list[Round] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    """Per mode: CPU seconds of the load generator, llmock and the gateway, all rounds."""
    others: float = 0.0
    """Per cent of one core other processes used during the rounds."""

    def count_cpu(self, mode: str, spent: Sequence[float]) -> None:
        totals = self.cpu.setdefault(mode, [0.0] * len(spent))
        for i, seconds in enumerate(spent):
            totals[i] += seconds


def _request_body() -> dict[str, object]:
    """What the gateway's OpenAI adapter sends for a new session's first message."""
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": USER_TEXT},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def direct_round(client: httpx.AsyncClient, url: str, cpu: int | None) -> Round:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        return await _read_direct(client, url)
    finally:
        if cpu is not None:
            pin_self()


async def _read_direct(client: httpx.AsyncClient, url: str) -> Round:
    body, headers = _request_body(), {"authorization": f"Bearer {API_KEY}"}
    started = time.perf_counter()
    first, deltas = 0.0, 0
    async with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in _decode_chunk(line[6:]).choices:
                if choice.delta.content:
                    deltas += 1
                    if not first:
                        first = time.perf_counter()
    return Round(first - started, time.perf_counter() - started, deltas)


async def gateway_round(url: str, cpu: int | None) -> Round:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    try:
        return await _read_gateway(url)
    finally:
        if cpu is not None:
            pin_self()


async def _read_gateway(url: str) -> Round:
    ws = await connect(url)
    try:
        ws.send(_encode({"type": "session.start"}))
        await ws.recv_type("session.created")
        started = time.perf_counter()
        ws.send(_encode({"type": "user.message", "text": USER_TEXT}))
        first, _ = await ws.recv_type("text.delta")
        deltas = 1
        while True:
            at, payload = await ws.recv()
            kind = frame_type(payload)
            if kind == "text.delta":
                deltas += 1
            elif kind == "response.done":
                return Round(first - started, at - started, deltas)
            elif kind == "error":
                raise RuntimeError(f"the gateway answered an error: {payload.decode()}")
    finally:
        await ws.close()


def _cpu(llmock: Server, gw: Server) -> tuple[float, float, float]:
    return self_cpu_seconds(), cpu_seconds(llmock.pid), cpu_seconds(gw.pid)


async def run(llmock: Server, gw: Server, rounds: int, warmup: int, cpu: int | None) -> Rounds:
    out = Rounds()
    url = f"{llmock.http_url}/v1/chat/completions"
    ws_url = f"ws://127.0.0.1:{gw.port}/v1/realtime"
    others = OtherLoad(llmock.pid, gw.pid)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        for n in range(warmup + rounds):
            if n == warmup:
                others.start()
            before = _cpu(llmock, gw)
            direct = await direct_round(client, url, cpu)
            middle = _cpu(llmock, gw)
            through = await gateway_round(ws_url, cpu)
            after = _cpu(llmock, gw)
            if n >= warmup:
                out.direct.append(direct)
                out.gateway.append(through)
                out.count_cpu("direct", [b - a for a, b in zip(before, middle, strict=True)])
                out.count_cpu("gateway", [b - a for a, b in zip(middle, after, strict=True)])
    out.others = others.percent()
    return out


def _ms(samples: Sequence[float]) -> str:
    return f"p50 {statistics.median(samples) * 1e3:7.2f}  p99 {percentile(samples, 99) * 1e3:7.2f}"


def report(rounds: Rounds, words: int) -> None:
    for name, series in (("direct", rounds.direct), ("gateway", rounds.gateway)):
        deltas = statistics.median(r.deltas for r in series)
        print(
            f"{name:<8} first delta {_ms([r.first for r in series])} ms   "
            f"total {_ms([r.total for r in series])} ms   ({deltas:g} deltas of {words} words)"
        )
    for name, series in (("direct", rounds.direct), ("gateway", rounds.gateway)):
        client, llmock, gw = (seconds / len(series) * 1e3 for seconds in rounds.cpu[name])
        print(
            f"{name:<8} CPU per round: load generator {client:.1f} ms, llmock {llmock:.1f} ms,"
            f" gateway {gw:.1f} ms (whole rounds, connect and session.start included)"
        )
    first_d = statistics.median(r.first for r in rounds.direct)
    first_g = statistics.median(r.first for r in rounds.gateway)
    total_d = statistics.median(r.total for r in rounds.direct)
    total_g = statistics.median(r.total for r in rounds.gateway)
    print(
        f"the gateway adds {(first_g - first_d) * 1e3:.2f} ms to the first delta (p50s; "
        f"target <= 2 ms), total {total_g / total_d:.3f}x direct (target <= 1.05x)"
    )
    print(f"other processes meanwhile: {rounds.others:.0f} % of one core (noise if not ~0)")


def _serve_llmock(fd: int) -> None:
    """The llmock process: llmock's app on the inherited listening socket ``fd``."""
    import uvicorn
    from llmock.main import create_app
    from llmock.simulation import MockResponseSettings

    app = create_app(responses=MockResponseSettings(response_style="static", tool_mode="off"))
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", log_config=None
    )
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


def _script(llmock_url: str, words: int) -> None:
    text = " ".join(f"w{i}" for i in range(words))
    behavior = {"type": "reply", "text": text, "times": None}  # every request, for good
    httpx.post(f"{llmock_url}/_llmock/scenario", json={"behaviors": [behavior]}).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--words", type=int, default=200, help="words (chunks) of the answer")
    parser.add_argument("--rounds", type=int, default=200, help="timed rounds of each")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds of each first")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the run, s")
    parser.add_argument(
        "--direct-cpu",
        type=int,
        default=SERVER_CPU,
        help="CPU every round reads from (default: the gateway's; llmock keeps its own)",
    )
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # the llmock process
    args = parser.parse_args()
    if args.fd is not None:
        _serve_llmock(args.fd)
        return
    pin_self()
    direct_cpu = args.direct_cpu if pinning() else None
    where = placement(
        gateway=SERVER_CPU,
        llmock=CLIENT_CPU,
        load_generator=CLIENT_CPU,
        readers=args.direct_cpu,
    )
    print(f"# bench.upstream: {machine()}; {where}")
    llmock_argv = [sys.executable, "-m", "bench.upstream"]
    with (
        server(llmock_argv, ready_path="/health", cpu=CLIENT_CPU) as llmock,
        tempfile.TemporaryDirectory(prefix="bench-upstream-") as folder,
    ):
        _script(llmock.http_url, args.words)
        agent = Path(folder) / "agent.toml"
        agent.write_text(
            AGENT.format(instructions=INSTRUCTIONS, model=MODEL, base_url=f"{llmock.http_url}/v1")
        )
        with gateway(agent, env={"BENCH_UPSTREAM_KEY": API_KEY}) as gw:

            async def bounded() -> Rounds:
                async with asyncio.timeout(args.timeout):
                    return await run(llmock, gw, args.rounds, args.warmup, direct_cpu)

            rounds = uvloop.run(bounded())
    report(rounds, args.words)


if __name__ == "__main__":
    main()

"""Time to the first text delta: the gateway against the leanest hand-written relay.

Both read the same real OpenAI-compatible model server, the shared harness's
``.bench/servers/upstream_openai.py``, whose ``fanout 20`` answer is 20 chunks streamed at
once, so what differs between the two is only the server in the middle:

- the gateway: ``.bench/servers/gateway_openai_serve.py`` (``gateway serve`` with an agent
  on the ``openai`` provider at the upstream), ``ws://.../v1/realtime``, v1 protocol: a
  ``session.start`` first, answered by ``session.created``;
- the relay: ``.bench/servers/relay_aiohttp_lean.py`` (Starlette, one shared aiohttp
  session, msgspec; no history, no limits), ``ws://.../ws``, no handshake of its own.

Each round sends ``{"type":"user.message","text":"fanout 20"}`` and times, from the send,
the arrival of the first ``text.delta`` frame and of ``response.done``. Rounds alternate
(gateway, relay, gateway, ...), the warm-up rounds first and untimed. Each server keeps one
connection, and the gateway one session, across 50 rounds; then both get a new connection
(and the gateway a new session, outside the timing). This bounds the gateway's history (the
relay sends none) and stays within its default per-socket rate limit (a burst of 100 frames).

The servers run under the harness's venv (``.bench/.venv``, which has the project
installed: ``make .bench/.installed``), the gateway and the relay on CPU 0, the upstream
and this client on CPU 1; with fewer than two CPUs nothing is pinned. Only one server is
busy at a time, so they do not compete for CPU 0. Every process started here is ended
(SIGTERM, then SIGKILL) when the run ends, fails, or is interrupted (Ctrl-C, SIGTERM).
Prints figures; asserts nothing.

    .venv/bin/python -m bench.first_delta_relay [--rounds 200] [--warmup 20] [--only relay]

(``--only`` measures one of the two, e.g. while the other does not start.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from bench.figure import percentile
from bench.server_process import (
    CLIENT_CPU,
    READY_TIMEOUT,
    SERVER_CPU,
    OtherLoad,
    _end,
    machine,
    pin_self,
    pinning,
    placement,
)
from bench.upstream import Round  # first delta and whole answer, seconds; deltas
from bench.ws_client import WebSocket, connect, frame_type

__all__: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / ".bench"
HARNESS_PYTHON = HARNESS / ".venv" / "bin" / "python"
FANOUT = 20
USER_MESSAGE = b'{"type":"user.message","text":"fanout %d"}' % FANOUT
SESSION_START = b'{"type":"session.start"}'
ROUNDS_PER_SESSION = 50
"""Rounds on one connection (and gateway session): 51 frames, within the burst of 100."""
SERVERS = {
    "gateway": ("gateway_openai_serve.py", "/v1/realtime", True),
    "relay": ("relay_aiohttp_lean.py", "/ws", False),
}
"""Name: the harness's script, the WebSocket path, whether it wants a ``session.start``."""
ROUND_TIMEOUT = 10.0
"""Seconds a round (or opening a connection) may take before the run fails."""


@dataclass
class Target:
    """A server under test, listening."""

    name: str
    url: str
    pid: int
    session_start: bool
    """Whether a connection starts with a v1 ``session.start``."""


@dataclass
class Results:
    rounds: dict[str, list[Round]] = field(default_factory=dict)
    others: float = 0.0
    """Per cent of one core other processes used during the timed rounds."""


def _free_port() -> int:
    """A port nothing listens on now (the harness's servers take ``--port``, not a socket)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tail(log: str) -> str:
    return Path(log).read_text(errors="replace")[-3000:]


@contextmanager
def harness_server(script: str, port: int, cpu: int, *args: str) -> Iterator[int]:
    """Run ``.bench/servers/<script> --port <port> <args>`` on ``cpu`` until the block ends;
    yields its PID once it listens."""
    argv = [str(HARNESS_PYTHON), str(HARNESS / "servers" / script), "--port", str(port), *args]
    pin = pinning()
    with tempfile.NamedTemporaryFile(prefix="bench-relay-", suffix=".log") as log:
        proc = subprocess.Popen(
            argv,
            cwd=HARNESS,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this process only, which ends it
            # this process has no threads when it starts a server
            preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if pin else None,
        )
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while not _listening(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{script} is not listening on {port}:\n{_tail(log.name)}")
                time.sleep(0.05)  # polling a condition, under the deadline
            try:
                yield proc.pid
            except Exception:  # what the server said may explain it (an error frame does not)
                print(f"--- the end of {script}'s output:\n{_tail(log.name)}", file=sys.stderr)
                raise
        finally:
            _end(proc)


async def open_connection(target: Target) -> WebSocket:
    ws = await connect(target.url)
    if target.session_start:
        ws.send(SESSION_START)
        await ws.recv_type("session.created")
    return ws


async def one_round(ws: WebSocket) -> Round:
    first, deltas = 0.0, 0
    started = time.perf_counter()
    ws.send(USER_MESSAGE)
    while True:
        at, payload = await ws.recv()  # ``at``: when its bytes arrived, before parsing
        kind = frame_type(payload)
        if kind == "text.delta":
            if not deltas:
                first = at
            deltas += 1
        elif kind == "response.done":
            if not deltas:
                raise RuntimeError(f"response.done without a text.delta: {payload.decode()}")
            return Round(first - started, at - started, deltas)
        elif kind == "error":
            raise RuntimeError(f"the server answered an error: {payload.decode()}")


async def run(targets: Sequence[Target], upstream_pid: int, rounds: int, warmup: int) -> Results:
    out = Results(rounds={target.name: [] for target in targets})
    others = OtherLoad(upstream_pid, *(target.pid for target in targets))
    connections: dict[str, WebSocket] = {}
    try:
        for n in range(warmup + rounds):
            if n == warmup:
                others.start()
            for target in targets:
                async with asyncio.timeout(ROUND_TIMEOUT):
                    if n % ROUNDS_PER_SESSION == 0:
                        if target.name in connections:
                            await connections.pop(target.name).close()
                        connections[target.name] = await open_connection(target)
                    timed = await one_round(connections[target.name])
                if n >= warmup:
                    out.rounds[target.name].append(timed)
        out.others = others.percent()
    finally:
        for ws in connections.values():
            await ws.close()  # bounded by the client's close timeout
    return out


def _ms(samples: Sequence[float]) -> str:
    return "  ".join(f"p{p}={percentile(samples, p) * 1e3:7.2f}" for p in (50, 90, 99))


def _median_ms(rounds: Sequence[Round], what: str) -> float:
    return float(statistics.median(getattr(r, what) for r in rounds)) * 1e3


def report(results: Results) -> None:
    for name, rounds in results.rounds.items():
        deltas = statistics.median(r.deltas for r in rounds)
        print(
            f"{name:<8} first delta {_ms([r.first for r in rounds])} ms   "
            f"total {_ms([r.total for r in rounds])} ms   "
            f"(n={len(rounds)}, {deltas:g} deltas a round)"
        )
    if results.rounds.keys() == SERVERS.keys():
        gateway, relay = results.rounds["gateway"], results.rounds["relay"]
        first = _median_ms(gateway, "first") - _median_ms(relay, "first")
        total = _median_ms(gateway, "total") - _median_ms(relay, "total")
        print(
            f"gateway - relay (difference of the medians): first delta {first:+.2f} ms, "
            f"total {total:+.2f} ms"
        )
    print(f"other processes meanwhile: {results.others:.0f} % of one core (noise if not ~0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=200, help="timed rounds of each server")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds of each first")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the rounds, s")
    parser.add_argument(
        "--only",
        type=lambda names: names.split(","),
        default=list(SERVERS),
        help="servers to measure, comma-separated (default: gateway,relay)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be at least 1, --warmup at least 0")
    if unknown := set(args.only) - set(SERVERS):
        parser.error(f"--only: no server named {', '.join(sorted(unknown))}")
    if not HARNESS_PYTHON.exists():
        raise SystemExit(f"no {HARNESS_PYTHON}: run `make .bench/.installed` first")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # unwind, ending the servers
    pin_self(CLIENT_CPU)
    servers = {name: SERVER_CPU for name in SERVERS if name in args.only}
    where = placement(**servers, upstream=CLIENT_CPU, load_generator=CLIENT_CPU)
    print(f"# bench.first_delta_relay: {machine()}; {where}")
    print(f"# 'fanout {FANOUT}' x {args.rounds} rounds each after {args.warmup} of warm-up")
    with ExitStack() as stack:
        up_port = _free_port()
        lifetime = str(args.timeout + 4 * READY_TIMEOUT)  # the upstream's own backstop
        upstream_pid = stack.enter_context(
            harness_server(
                "upstream_openai.py", up_port, CLIENT_CPU, "--pace", "0.05", "--lifetime", lifetime
            )
        )
        targets = []
        for name, (script, path, session_start) in SERVERS.items():
            if name not in args.only:
                continue
            port = _free_port()
            pid = stack.enter_context(
                harness_server(script, port, SERVER_CPU, "--upstream-port", str(up_port))
            )
            targets.append(Target(name, f"ws://127.0.0.1:{port}{path}", pid, session_start))

        async def bounded() -> Results:
            async with asyncio.timeout(args.timeout):
                return await run(targets, upstream_pid, args.rounds, args.warmup)

        results = uvloop.run(bounded())
    report(results)


if __name__ == "__main__":
    main()

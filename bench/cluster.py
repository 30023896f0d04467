"""Sessions on Redis against sessions in memory: turn round trip, resume elsewhere, memory.

Starts its own redis-server (Debian's, on a unix socket in a temporary folder, no
persistence) and gateway processes (`python -m gateway serve` with the test agent), each
gateway pinned to CPU 0; this process (the load generator) and redis-server run on CPU 1.
Prints figures; asserts nothing.

- client-function turn: user.message -> tool.calls -> tool.results -> response.done, many
  turns in one session (the history grows, as in a real conversation), memory store against
  ``--store unix://...`` in the same run;
- resume: the shipped SDK, through a proxy (tests/proxy.py, in this process) as through a
  load balancer, starts a session on node A and runs one turn; the proxy is pointed at
  node B and cuts the socket (no close frame), and the time from the cut to the SDK
  delivering ``session.resumed`` is taken (its first attempt does not wait: detection,
  connect and handshake through the proxy, ``session.resume``, takeover, replay); the same
  on one node (memory and Redis) for comparison;
- sessions held: gateway RSS and redis-server ``used_memory`` per idle session.

    .venv/bin/python -m bench.cluster [--turns 2000] [--resumes 300] [--sessions 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from bench.turn_latency import _client_function_turns
from client_sdk import Connection, connect, connect_raw
from gateway.wire.v1 import SessionCreated, SessionResumed, SessionStart
from tests.proxy import proxy_to
from tests.redis_server import redis_server
from tests.support import TEST_AGENT

__all__: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPUS = {0}
CLIENT_CPUS = {1}
START_TIMEOUT = 30.0
TOKEN_SECRET = "bench-cluster-secret-not-for-production-0123456789"


@dataclass
class Node:
    """One gateway process."""

    name: str
    url: str
    port: int
    pid: int


def _free_port() -> int:
    """A free port below the ephemeral range (32768-60999), so no client collides with it."""
    rnd = random.Random()
    for _ in range(500):
        port = rnd.randint(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port below 32768")


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def rss_kib(pid: int) -> int:
    """Resident set size of a process, KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


@contextmanager
def gateway_node(name: str, store: str, *extra: str) -> Iterator[Node]:
    """A `gateway serve` process with the test agent on a free port, pinned to CPU 0."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "gateway", "serve",
        "--host", "127.0.0.1", "--port", str(port),
        "--agent", str(TEST_AGENT), "--no-auth",
        "--store", store, "--node-id", name,
        "--log-level", "error", "--first-message-timeout", "600",
        "--token-secret", TOKEN_SECRET,  # shared, as every node of a cluster has it
        "--max-messages-per-second", "100000",  # a turn every few ms is this bench's point
        *extra,
    ]  # fmt: skip
    pin: Callable[[], None] = lambda: os.sched_setaffinity(0, SERVER_CPUS)  # noqa: E731
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, preexec_fn=pin)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(port):
            if proc.poll() is not None:
                raise RuntimeError(f"gateway {name} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway {name} not listening after {START_TIMEOUT} s")
            time.sleep(0.05)  # polling a condition with a deadline
        yield Node(name, f"ws://127.0.0.1:{port}/v1/realtime", port, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def resume_times(start: Node, resume: Node, samples: int) -> list[float]:
    """Seconds from a cut to the SDK delivering ``session.resumed`` from ``resume``.

    Each sample is a new session through a proxy to ``start`` that runs one turn; then the
    proxy is pointed at ``resume`` and cuts the socket the hard way (no close frame).
    """
    times: list[float] = []
    for _ in range(samples):
        async with proxy_to(start.port) as proxy, connect(proxy.url()) as conv:
            events = conv.events()
            async with asyncio.timeout(10):
                assert "".join([d async for d in conv.say("echo one two three")])
            proxy.upstream = resume.port
            started = time.perf_counter()
            proxy.drop()
            async with asyncio.timeout(10):
                async for event in events:
                    if isinstance(event, SessionResumed):
                        break
            times.append(time.perf_counter() - started)
    return times


async def _used_memory(redis_url: str) -> int:
    client = aioredis.Redis.from_url(redis_url)
    try:
        info = await client.info("memory")
        return int(info["used_memory"])
    finally:
        await client.aclose()


@asynccontextmanager
async def _idle_sessions(url: str, count: int) -> AsyncIterator[list[Connection]]:
    async with contextlib.AsyncExitStack() as stack:
        conns = []
        for _ in range(count):
            conn = await stack.enter_async_context(connect_raw(url))
            await conn.send(SessionStart())
            assert isinstance(await conn.recv(), SessionCreated)
            conns.append(conn)
        yield conns


async def held(node: Node, redis_url: str, count: int) -> tuple[float, float]:
    """KiB of gateway RSS and bytes of redis-server memory per idle session."""
    rss0, mem0 = rss_kib(node.pid), await _used_memory(redis_url)
    async with _idle_sessions(node.url, count):
        rss1, mem1 = rss_kib(node.pid), await _used_memory(redis_url)
    return (rss1 - rss0) / count, (mem1 - mem0) / count


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _ms(samples: list[float]) -> str:
    return (
        f"n={len(samples):<5} p50={statistics.median(samples) * 1000:7.3f} ms"
        f"  p99={_pct(samples, 0.99) * 1000:7.3f} ms"
    )


def _turn_report(label: str, samples: list[float]) -> None:
    tenth = max(1, len(samples) // 10)
    print(f"{label:<38} {_ms(samples)}")
    # the state written per batch grows with the history: show the first and last tenth
    print(f"{'  first / last tenth p50':<38} {statistics.median(samples[:tenth]) * 1000:.3f}"
          f" / {statistics.median(samples[-tenth:]) * 1000:.3f} ms")  # fmt: skip


async def run(args: argparse.Namespace, redis_url: str) -> None:
    for rep in range(1, args.repeats + 1):
        print(f"--- repeat {rep}")
        with gateway_node("mem-a", "memory") as mem, gateway_node("redis-a", redis_url) as a:
            with gateway_node("redis-b", redis_url) as b:
                for node in (mem, a):  # warm up both (imports, first sessions)
                    await _client_function_turns(node.url, 20)
                    await resume_times(node, node, 10)
                # memory first on odd repeats, Redis first on even ones
                order = [("memory", mem), ("redis", a)][:: 1 if rep % 2 else -1]
                for label, node in order:
                    turns = await _client_function_turns(node.url, args.turns)
                    _turn_report(f"client-function turn, {label}", turns)
                for label, start, end in [
                    ("resume same node, memory", mem, mem),
                    ("resume same node, redis", a, a),
                    ("resume other node, redis", a, b),
                ]:
                    times = await resume_times(start, end, args.resumes)
                    print(f"{label:<38} {_ms(times)}")
        if args.sessions:  # fresh processes, so earlier sessions do not count
            for label, store in (("memory", "memory"), ("redis", redis_url)):
                with gateway_node(f"held-{label}", store) as node:
                    await _client_function_turns(node.url, 5)
                    rss, used = await held(node, redis_url, args.sessions)
                print(
                    f"{args.sessions} idle sessions, {label:<6}       "
                    f"gateway {rss:6.1f} KiB/session, redis-server {used / 1024:6.2f} KiB/session"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--resumes", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=2000, help="0 skips the memory figure")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    os.sched_setaffinity(0, CLIENT_CPUS)  # redis-server, started below, inherits it
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, gateways on CPU 0,")
    print("this client and redis-server (unix socket, no persistence) on CPU 1")
    with tempfile.TemporaryDirectory(prefix="gwcluster-") as folder:
        with redis_server(Path(folder)) as server:
            asyncio.run(run(args, server.url))


if __name__ == "__main__":
    main()

"""Resumes through nginx in front of three nodes: sticky by session against round robin.

Starts its own redis-server (Debian's, on a unix socket in a temporary folder, no
persistence), three `gateway serve` nodes on it (bench/cluster.py's `gateway_node`: the test
agent, pinned to CPU 0) and Debian's nginx in front (tests/nginx.py: the shipped
deploy/nginx.conf, or the same without its `hash` line). This process (the load generator),
nginx and redis-server run on CPU 1. Prints figures; asserts nothing.

For each routing it opens ``--sessions`` conversations with the shipped Python SDK through
nginx (each runs one turn), then makes ``--resumes`` resumes one at a time, each of a session
picked at random (seeded): the SDK's socket is cut the hard way (no close frame) and the time
from the cut to the SDK delivering ``session.resumed`` is taken (detection, a new socket
through nginx, ``session.resume``, on the same node an attach, on another a takeover from
Redis, the replay). Redis's ``owner`` key before and after tells whether the resume moved the
session to another node; a turn after each resume (not timed) checks the session goes on.

    .venv/bin/python -m bench.resume_balancer [--sessions 20] [--resumes 200] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.cluster import CLIENT_CPUS, Node, _pct, gateway_node
from client_sdk import Conversation, connect
from gateway.store.redis import RedisStore
from gateway.wire.v1 import SessionResumed
from tests.nginx import nginx_in_front
from tests.redis_server import redis_server

__all__: list[str] = []

NODES = 3
WAIT = 20.0
"""Seconds a resume or a turn may take before the run counts it as failed."""
ROUTINGS = (("sticky", True), ("round robin", False))


@dataclass
class Run:
    """What one routing's resumes measured."""

    times: list[float] = field(default_factory=list)
    """Seconds from each cut to ``session.resumed``."""
    moved: list[bool] = field(default_factory=list)
    """Whether each resume moved its session to another node."""
    first: list[bool] = field(default_factory=list)
    """Whether each resume was its session's first."""
    failed: int = 0
    """Resumes or turns after them that did not come within ``WAIT`` or went wrong."""
    adopted: float = 0.0
    """Sessions the nodes took over from another node during the resumes (their metric)."""


async def adoptions(nodes: list[Node]) -> float:
    """``gateway_sessions_adopted_total`` summed over ``nodes``."""
    total = 0.0
    async with httpx.AsyncClient(timeout=5.0) as client:
        for node in nodes:
            text = (await client.get(f"http://127.0.0.1:{node.port}/metrics")).text
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name == "gateway_sessions_adopted_total":
                    total += float(value)
    return total


async def owner(store: RedisStore, conv: Conversation) -> str | None:
    assert conv.session is not None
    return await store.owner(conv.session.session_id)


async def resume_once(conv: Conversation) -> float:
    """Cut ``conv``'s socket; seconds until the SDK delivers ``session.resumed``."""
    events = conv.events()  # subscribed before the cut: the answer cannot be missed
    try:
        assert conv._ws is not None
        started = time.perf_counter()
        conv._ws.transport.abort()
        async with asyncio.timeout(WAIT):
            async for event in events:
                if isinstance(event, SessionResumed):
                    return time.perf_counter() - started
        raise AssertionError("unreachable: events() ends by raising")
    finally:
        await events.aclose()


async def turn(conv: Conversation, text: str) -> bool:
    """Whether the scripted model echoes ``text`` back within ``WAIT``."""
    async with asyncio.timeout(WAIT):
        return "".join([d async for d in conv.say(f"echo {text}")]) == text


async def measure(
    url: str, nodes: list[Node], store: RedisStore, sessions: int, resumes: int, seed: int
) -> Run:
    run = Run()
    rnd = random.Random(seed)
    async with contextlib.AsyncExitStack() as stack:
        convs = [await stack.enter_async_context(connect(url)) for _ in range(sessions)]
        for i, conv in enumerate(convs):
            await turn(conv, f"hello {i}")
        resumed: set[int] = set()
        adopted = await adoptions(nodes)
        for n in range(resumes):
            pick = rnd.randrange(sessions)
            conv = convs[pick]
            before = await owner(store, conv)
            try:
                run.times.append(await resume_once(conv))
                answered = await turn(conv, f"after {n}")
            except (TimeoutError, AssertionError):
                run.failed += 1
                continue
            run.failed += not answered
            run.moved.append(await owner(store, conv) != before)
            run.first.append(pick not in resumed)
            resumed.add(pick)
        run.adopted = await adoptions(nodes) - adopted
    return run


def _ms(samples: list[float]) -> str:
    if not samples:
        return "n=0"
    return (
        f"n={len(samples):<4} p50={statistics.median(samples) * 1000:6.1f} ms"
        f"  p99={_pct(samples, 0.99) * 1000:6.1f} ms"
    )


def report(label: str, run: Run) -> None:
    moved = sum(run.moved)
    firsts = [m for m, f in zip(run.moved, run.first, strict=True) if f]
    later = [m for m, f in zip(run.moved, run.first, strict=True) if not f]
    print(f"{label:<12} resume {_ms(run.times)}")
    print(
        f"{'':<12} moved {moved} of {len(run.moved)}: {sum(firsts)} of {len(firsts)} first"
        f" resumes of a session, {sum(later)} of {len(later)} later ones;"
        f" adoptions {run.adopted:g}; failed {run.failed}"
    )
    stayed = [t for t, m in zip(run.times, run.moved, strict=True) if not m]
    went = [t for t, m in zip(run.times, run.moved, strict=True) if m]
    print(f"{'':<12}   stayed on its node {_ms(stayed)}")
    print(f"{'':<12}   moved to another   {_ms(went)}")


async def run(args: argparse.Namespace, redis_url: str, folder: Path) -> None:
    extra = ("--max-sockets-per-ip", "100000")
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(gateway_node(f"n{i + 1}", redis_url, *extra)) for i in range(NODES)
        ]
        store = RedisStore.from_url(redis_url, session_ttl=120, lease_ttl=10)
        try:
            for rep in range(1, args.repeats + 1):
                print(f"--- repeat {rep}")
                order = ROUTINGS if rep % 2 else ROUTINGS[::-1]  # sticky first on odd repeats
                for label, sticky in order:
                    run_dir = Path(tempfile.mkdtemp(prefix="nginx-", dir=folder))
                    async with nginx_in_front(
                        [node.port for node in nodes], run_dir, sticky=sticky
                    ) as port:
                        url = f"ws://127.0.0.1:{port}/v1/realtime"
                        if rep == 1 and label == order[0][0]:  # warm up every node
                            await measure(url, nodes, store, NODES, 3 * NODES, seed=0)
                        measured = await measure(
                            url, nodes, store, args.sessions, args.resumes, seed=args.seed + rep
                        )
                    report(label, measured)
        finally:
            await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--resumes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.sched_setaffinity(0, CLIENT_CPUS)  # redis-server and nginx, started below, inherit it
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {NODES} gateways on CPU 0,")
    print("this client, nginx and redis-server (unix socket, no persistence) on CPU 1;")
    print(f"{args.sessions} sessions, {args.resumes} resumes one at a time per routing")
    with tempfile.TemporaryDirectory(prefix="gwbalancer-") as name:
        folder = Path(name)
        with redis_server(folder) as server:
            asyncio.run(run(args, server.url, folder))


if __name__ == "__main__":
    main()

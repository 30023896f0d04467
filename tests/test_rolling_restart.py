"""A rolling restart under conversation: three gateway processes on one redis-server
behind nginx (round robin, no stickiness), each stopped with SIGTERM (a deploy), started
again and ready before the next one stops, while conversations of the shipped Python SDK
go on through nginx. Every node tells its sockets ``session.going_away`` once their
responses are done, the SDKs resume on another node ahead of the close, and the
conversations see no gap: every answer arrives whole, once, in order, and no event comes
later than a resume takes.

The figures (the resumes' durations, the answers' first-delta delays and longest silences)
are printed; ``bench/`` has none of this, the bound is the test's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from client_sdk import Conversation, connect
from gateway.wire.v1 import Error, SessionGoingAway, SessionResumed, SessionSnapshot
from tests.cluster import Cluster, behind_nginx, running_cluster
from tests.redis_server import RedisServer
from tests.support import Recording, record

pytestmark = pytest.mark.slow  # processes, nginx and restarts: tens of seconds

CONVERSATIONS = 6
WORDS = 8
PACE = 0.05
"""Seconds between the words of the cluster agent's "slowly" rule."""
GRACE = 10.0
MOVE_BOUND = 1.0
"""Seconds from a notice to the SDK's resume on another node, at most."""
SLACK = 0.25
"""Seconds of scheduling noise allowed on this 2-core machine, on top of a resume."""


@dataclass
class Talk:
    """One conversation's turns: what it asked, what came back, and when."""

    conv: Conversation
    recording: Recording
    turns: list[tuple[str, str]] = field(default_factory=list)
    first_delta: list[float] = field(default_factory=list)
    """Seconds from each post to its first delta."""
    silences: list[float] = field(default_factory=list)
    """The longest wait between two deltas of each answer."""


async def converse(talk: Talk, index: int, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    turn = 0
    while not stop.is_set():
        turn += 1
        words = " ".join(f"c{index}t{turn}w{i}" for i in range(WORDS))
        posted = last = loop.time()
        first: float | None = None
        longest = 0.0
        parts: list[str] = []
        async with asyncio.timeout(GRACE * 2):
            async for delta in talk.conv.say(f"slowly {words}"):
                now = loop.time()
                if first is None:
                    first = now - posted
                else:
                    longest = max(longest, now - last)
                last = now
                parts.append(delta)
        talk.turns.append((words, "".join(parts)))
        talk.first_delta.append(first or 0.0)
        talk.silences.append(longest)


async def two_more_turns(talk: Talk) -> None:
    done = len(talk.turns) + 2

    def enough(_: object) -> bool:
        return len(talk.turns) >= done

    await talk.recording.until(enough, 30.0)


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    args = ["--shutdown-timeout", str(GRACE)]
    async with running_cluster(tmp_path, redis.url, args=args) as nodes:
        yield nodes


async def test_a_rolling_restart_under_conversation_shows_no_gap(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with behind_nginx(cluster, tmp_path, sticky=False) as url:
        talks: list[Talk] = []
        for _ in range(CONVERSATIONS):
            conv = connect(url, max_reconnect_delay=0.2)
            await conv.__aenter__()
            talks.append(Talk(conv, record(conv)))
            await conv.start()
        stop = asyncio.Event()
        talking = [asyncio.create_task(converse(t, i, stop)) for i, t in enumerate(talks)]
        try:
            for node in cluster.nodes:
                assert await node.terminate() == 0, node.tail()
                node.start()
                await node.wait_ready()
            for talk in talks:  # two more turns each, on the restarted nodes
                await two_more_turns(talk)
        finally:
            stop.set()
            results = await asyncio.gather(*talking, return_exceptions=True)
            for talk in talks:
                talk.recording.stop()
                await talk.conv.close()
        assert [r for r in results if r is not None] == []
        report(talks)


def report(talks: list[Talk]) -> None:
    """Check the conversations, and print the figures."""
    resumes: list[float] = []
    for talk in talks:
        assert all(asked == said for asked, said in talk.turns), talk.turns
        events, times = talk.recording.events, talk.recording.times
        assert not [e for e in events if isinstance(e, Error | SessionSnapshot)]
        numbers = [e.seq for e in events if e.seq]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
        notices = [i for i, e in enumerate(events) if isinstance(e, SessionGoingAway)]
        assert notices, "every session lived on a node that restarted"
        for i in notices:  # each notice, then the SDK's resume on another node
            answer = next(j for j in range(i, len(events)) if isinstance(events[j], SessionResumed))
            resumes.append(times[answer] - times[i])
    first = sorted(d for t in talks for d in t.first_delta)
    silence = sorted(s for t in talks for s in t.silences)
    resume = max(resumes)
    turns = sum(len(t.turns) for t in talks)
    print(
        f"\n{turns} turns, {len(talks)} conversations, 3 restarts, {len(resumes)} moves:"
        f" resume after the notice p50 {ms(resumes, 0.5)}, max {ms(resumes, 1.0)};"
        f" first delta p50 {ms(first, 0.5)}, max {ms(first, 1.0)};"
        f" longest silence in an answer p50 {ms(silence, 0.5)}, max {ms(silence, 1.0)}"
    )
    # The SDKs moved at the notice, not at the close (which comes 2 s after it, at the
    # soonest: runtime._MOVE_WAIT)...
    assert resume <= MOVE_BOUND
    # ... and no event came later than that move took: neither an answer's start nor a delta.
    assert first[-1] <= first[len(first) // 2] + resume + SLACK
    assert silence[-1] <= PACE + resume + SLACK


def ms(values: list[float], at: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(len(ordered) * at))] * 1000:.0f} ms"

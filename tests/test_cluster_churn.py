"""Three gateway processes on one redis-server behind round-robin nginx (no stickiness),
unpaced conversations whose sockets are cut at every kind of moment: nothing lost,
nothing twice (tests/churn.py has the checks).

The short form runs in ``make test``; ``make soak`` runs the long one (300 sessions for
60 s, as issue 28 measured) through the same test, sized by the environment:
``CHURN_SESSIONS``, ``CHURN_SECONDS``, ``CHURN_CUT_EVERY``, ``CHURN_SEED``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.churn import Churn
from tests.cluster import Cluster, adoptions, behind_nginx, running_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

SESSIONS = int(os.environ.get("CHURN_SESSIONS", "100"))
SECONDS = float(os.environ.get("CHURN_SECONDS", "20"))
CUT_EVERY = float(os.environ.get("CHURN_CUT_EVERY", "4"))
SEED = int(os.environ.get("CHURN_SEED", "1"))
KILL_EVERY = 20.0
"""Seconds between two SIGKILLs in the run with kills (each node comes back 5 s later)."""
TOOL_TIMEOUT = 10.0


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    args = [
        "--server-tool-timeout", str(TOOL_TIMEOUT),
        # Unpaced users send faster than a person types.
        "--max-messages-per-second", "1000",
        "--max-message-burst", "1000",
    ]  # fmt: skip
    async with running_cluster(tmp_path, redis.url, args=args) as nodes:
        yield nodes


@pytest.fixture
async def front(cluster: Cluster, tmp_path: Path) -> AsyncIterator[str]:
    """/v1/realtime through nginx, round robin: nearly every resume lands elsewhere."""
    async with behind_nginx(cluster, tmp_path, sticky=False, worker_connections=4096) as url:
        yield url


async def test_churn_round_robin_no_node_killed_loses_nothing(cluster: Cluster, front: str):
    churn = Churn(
        front, cluster.runs, sessions=SESSIONS, seconds=SECONDS, cut_every=CUT_EVERY, seed=SEED
    )
    report = await churn.run()
    adopted = await adoptions(cluster)
    per_minute = adopted / report.seconds * 60
    print(f"\nchurn, no kills: {report.summary()}, {adopted} adoptions ({per_minute:.0f}/min)")
    assert report.problems == [], "\n".join(report.problems[:40])
    assert report.lost_with_a_node == 0
    assert report.turns > SESSIONS * 5
    assert report.cuts > SESSIONS * SECONDS / CUT_EVERY / 3
    assert adopted > report.cuts / 3  # round robin: most resumes moved the session


async def test_churn_round_robin_with_a_node_killed_every_20_s_loses_nothing(
    cluster: Cluster, front: str
):
    kills: list[str] = []

    async def killer(deadline: float) -> None:
        loop = asyncio.get_running_loop()
        victim = 0
        while loop.time() + KILL_EVERY / 2 < deadline:
            await asyncio.sleep(min(KILL_EVERY / 2, deadline - loop.time()))  # chaos pacing
            node = cluster.nodes[victim % len(cluster.nodes)]
            assert node.proc is not None
            churn.killed.add(node.proc.pid)
            node.kill()
            kills.append(node.name)
            await asyncio.sleep(5.0)
            node.start()
            await node.wait_ready()
            victim += 1
            await asyncio.sleep(KILL_EVERY / 2 - 5.0)

    churn = Churn(
        front,
        cluster.runs,
        sessions=SESSIONS,
        seconds=max(SECONDS, 25.0),
        cut_every=CUT_EVERY,
        seed=SEED + 1,
    )
    report = await churn.run(killer)
    print(f"\nchurn, nodes killed {kills}: {report.summary()}")
    assert kills
    assert report.problems == [], "\n".join(report.problems[:40])
    assert report.turns > SESSIONS * 5

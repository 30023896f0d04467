"""Three gateway processes on one redis-server, behind Debian's nginx (round robin).

Every node is a real ``gateway serve`` process (tests/cluster.py); clients are the
shipped Python SDK (``client_sdk.Conversation``, which resumes by itself) and connect
through nginx only, with the shipped deploy/nginx.conf. Nodes die by SIGKILL: no
shutdown, no lease given back. The agent (tests/data/cluster_agent.toml) is a scripted,
deterministic model, so a step that runs again on another node says the same words.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from client_sdk import Conversation, connect
from gateway.protocol import ServerMsg
from gateway.redis_store import RedisStore
from tests.cluster import Cluster
from tests.nginx import nginx_in_front
from tests.redis_server import RedisServer, redis_server

WAIT = 20.0
"""Seconds any one step of a test may take (a node's death and a resume included)."""


@pytest.fixture
def redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server; with AOF when the test parametrizes this fixture with ``True``."""
    with redis_server(tmp_path, appendonly=getattr(request, "param", False)) as server:
        yield server


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    nodes = Cluster(tmp_path, redis.url)
    try:
        await nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
async def front(cluster: Cluster, tmp_path: Path) -> AsyncIterator[str]:
    """The ``ws://`` URL of /v1/realtime through nginx, in front of every node."""
    run_dir = tmp_path / "nginx"
    run_dir.mkdir()
    async with nginx_in_front(cluster.ports, run_dir, worker_connections=2048) as port:
        yield f"ws://127.0.0.1:{port}/v1/realtime"


@pytest.fixture
async def owners(redis: RedisServer) -> AsyncIterator[RedisStore]:
    """The store as the nodes see it: ``owner(session_id)`` names the node driving it."""
    store = RedisStore.from_url(redis.url, session_ttl=120, lease_ttl=1)
    try:
        yield store
    finally:
        await store.aclose()


async def owner(store: RedisStore, conv: Conversation) -> str:
    assert conv.session is not None
    node = await store.owner(conv.session.session_id)
    assert node is not None
    return node


async def say(conv: Conversation, text: str) -> str:
    """The text of the response to ``text``, as the SDK assembles it."""
    async with asyncio.timeout(WAIT):
        return "".join([delta async for delta in conv.say(text)])


def cut(conv: Conversation) -> None:
    """Drop the SDK's socket the hard way (no close frame), as a phone losing signal."""
    assert conv._ws is not None
    conv._ws.transport.abort()


@asynccontextmanager
async def recording(conv: Conversation) -> AsyncIterator[list[ServerMsg]]:
    """Every event of ``conv`` from now on (subscribed at once: none is missed)."""
    seen: list[ServerMsg] = []

    async def record() -> None:
        async for event in conv.events():
            seen.append(event)

    task = asyncio.create_task(record())
    await asyncio.sleep(0)  # the task subscribes at its first step, before any await
    try:
        yield seen
    finally:
        task.cancel()


async def test_a_client_resumes_on_another_node_after_its_socket_is_cut(
    cluster: Cluster, front: str, owners: RedisStore
):
    async with connect(front) as conv:
        assert await say(conv, "echo before the cut") == "before the cut"
        first = await owner(owners, conv)
        # Round robin sends the resume to another node, unless the rotation comes round
        # to the same one: then cut again.
        for attempt in range(1, 6):
            cut(conv)
            assert await say(conv, f"echo after cut {attempt}") == f"after cut {attempt}"
            if await owner(owners, conv) != first:
                break
        assert await owner(owners, conv) != first
        assert conv.reconnects == attempt
        assert await say(conv, "echo still going") == "still going"
    adopted = [await node.metric("gateway_sessions_adopted_total") for node in cluster.nodes]
    assert sum(adopted) >= 1

"""Three gateway processes on one redis-server, behind Debian's nginx (round robin).

Every node is a real ``gateway serve`` process (tests/cluster.py); clients are the
shipped Python SDK (``client_sdk.Conversation``, which resumes by itself) and connect
through nginx only, with the shipped deploy/nginx.conf rendered without its stickiness
(every resume may land on another node). The torture of many unpaced conversations is
tests/test_cluster_churn.py. Nodes die by SIGKILL: no
shutdown, no lease given back. The agent (tests/data/cluster_agent.toml) is a scripted,
deterministic model, so a step that runs again on another node says the same words.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from client_sdk import Conversation, connect
from gateway.store.redis import RedisStore
from gateway.wire.v1 import (
    Error,
    ResponseCreated,
    ResponseDone,
    ServerMsg,
    SessionResumed,
    TextDone,
    ToolStatus,
)
from tests.cluster import (
    Cluster,
    Node,
    behind_nginx,
    collect,
    owner,
    owners_store,
    running_cluster,
)
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # processes, nginx and kills: seconds each

T = TypeVar("T", bound=ServerMsg)
WAIT = 20.0
TOOL_TIMEOUT = 10.0
"""Seconds a sync server tool may run (``--server-tool-timeout`` of every node). Its
deadline counts from dispatch: at the soak's kill, commits on the 2-core machine lag by
seconds, and 3 s failed a few tools that ran in 0.2 s."""
LOST = (
    "tool_timeout: the tool was running on another gateway node when this session moved"
    " (that node stopped or let the session go) and its outcome did not arrive in time;"
    " it is not run again"
)
"""The reason a server tool left on a dead node fails with (gateway/dispatch.py)."""
"""Seconds any one step of a test may take (a node's death and a resume included)."""


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    # A sync server tool lost with its node fails at its timeout: short.
    args = ["--server-tool-timeout", str(TOOL_TIMEOUT)]
    async with running_cluster(tmp_path, redis.url, args=args) as nodes:
        yield nodes


@pytest.fixture
async def front(cluster: Cluster, tmp_path: Path) -> AsyncIterator[str]:
    async with behind_nginx(cluster, tmp_path, sticky=False) as url:
        yield url


@pytest.fixture
async def owners(redis: RedisServer) -> AsyncIterator[RedisStore]:
    async with owners_store(redis.url) as store:
        yield store


async def say(conv: Conversation, text: str) -> str:
    """The text of the response to ``text``, as the SDK assembles it."""
    try:
        async with asyncio.timeout(WAIT):
            return "".join([delta async for delta in conv.say(text)])
    except TimeoutError:
        session_id = conv.session.session_id if conv.session else None
        raise AssertionError(
            f"no answer to {text!r} in {WAIT} s: session {session_id}, last_seq"
            f" {conv.last_seq}, {conv.reconnects} reconnects"
        ) from None


def cut(conv: Conversation) -> None:
    """Drop the SDK's socket the hard way (no close frame), as a phone losing signal."""
    assert conv._ws is not None
    conv._ws.transport.abort()


async def expect(conv: Conversation, kind: type[T]) -> asyncio.Task[T]:
    """A task that ends with the next event of ``kind`` (subscribed before this returns)."""

    async def first() -> T:
        async for event in conv.events():
            if isinstance(event, kind):
                return event
        raise AssertionError("unreachable: events() ends by raising")

    task = asyncio.create_task(first())
    await asyncio.sleep(0)  # the task subscribes at its first step, before any await
    return task


async def kill_owner(cluster: Cluster, store: RedisStore, conv: Conversation) -> Node:
    """SIGKILL the node driving ``conv``'s session."""
    node = cluster.node(await owner(store, conv))
    node.kill()
    return node


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


async def test_sigkill_mid_stream_the_answer_completes_through_another_node_whole(
    cluster: Cluster, front: str, owners: RedisStore
):
    words = " ".join(f"word{i}" for i in range(40))  # 40 x 50 ms: a kill lands mid-stream
    async with connect(front) as conv:
        await conv.start()
        got: list[str] = []
        killed: Node | None = None
        async with asyncio.timeout(WAIT):
            async for delta in conv.say(f"slowly {words}"):
                got.append(delta)
                if len(got) == 8:
                    killed = await kill_owner(cluster, owners, conv)
        assert killed is not None
        # No word twice, none missing: the step ran again on the adopting node, which sent
        # only what the client did not have.
        assert "".join(got) == words
        assert len(got) == 40
        assert conv.reconnects == 1
        assert await owner(owners, conv) != killed.name
        assert await say(conv, "echo and on") == "and on"


async def test_sigkill_mid_client_call_the_call_is_answered_once_through_another_node(
    cluster: Cluster, front: str, owners: RedisStore
):
    started, release = asyncio.Event(), asyncio.Event()
    tags: list[str] = []
    async with connect(front) as conv, recording(conv) as seen:

        @conv.client_function("device")
        async def device(tag: str) -> dict[str, str]:
            tags.append(tag)
            started.set()
            await release.wait()
            return {"value": f"v-{tag}"}

        await conv.start()
        answer = asyncio.create_task(say(conv, "ask t1"))
        await asyncio.wait_for(started.wait(), WAIT)
        resumed = await expect(conv, SessionResumed)
        killed = await kill_owner(cluster, owners, conv)
        event = await asyncio.wait_for(resumed, WAIT)
        assert [call.tool for call in event.open_calls] == ["device"]  # offered again...
        release.set()  # ...and answered by the run that was going on, through the new node
        assert await answer == "asking device said v-t1"
        assert tags == ["t1"]
        statuses = [e for e in seen if isinstance(e, ToolStatus)]
        assert [(s.tool, s.status, s.duplicate) for s in statuses] == [
            ("device", "completed", False)
        ]
        assert await owner(owners, conv) != killed.name
        assert await say(conv, "echo next turn") == "next turn"


def completion_told(events: list[ServerMsg]) -> bool:
    """The model was told of an async call's outcome and its response is done."""
    told = {e.response_id for e in events if isinstance(e, ResponseCreated) and e.call_id}
    return any(isinstance(e, ResponseDone) and e.response_id in told for e in events)


async def test_sigkill_with_an_async_tool_pending_the_tool_is_not_run_again(
    cluster: Cluster, front: str, owners: RedisStore
):
    async with connect(front) as conv:
        assert await say(conv, "track p1") == "tracking p1"
        told = await collect(conv, completion_told)
        killed = await kill_owner(cluster, owners, conv)
        assert await say(conv, "echo still here") == "still here"  # through another node
        # Nobody runs the tool any more: at its deadline the adopting node fails the call
        # and tells the model, which answers in a response of its own.
        events = await asyncio.wait_for(told, WAIT)
        (status,) = [e for e in events if isinstance(e, ToolStatus)]
        assert (status.tool, status.status) == ("track", "failed")
        assert status.error is not None
        assert status.error == LOST
        created = next(e for e in events if isinstance(e, ResponseCreated) and e.call_id)
        assert created.call_id == status.call_id
        texts = [e.text for e in events if isinstance(e, TextDone)]
        assert texts[-1] == f"tracking p1 failed: {status.error}"
        assert cluster.run_lines() == ["track p1"]  # once, on the node that died
        assert await owner(owners, conv) != killed.name


def store_down(events: list[ServerMsg]) -> bool:
    return any(isinstance(e, Error) and e.code == "store_unavailable" for e in events)


@pytest.mark.parametrize("redis", [True], indirect=True, ids=["aof"])
async def test_redis_restarted_mid_conversation_gives_a_clear_error_then_recovers(
    redis: RedisServer, cluster: Cluster, front: str, owners: RedisStore
):
    async with connect(front) as conv:
        assert await say(conv, "echo before") == "before"
        first = await owner(owners, conv)
        told = await collect(conv, store_down)
        redis.stop()  # SIGKILL; its append-only file has every write
        # The node goes on with the session live, and tells the client the store is down.
        assert await say(conv, "echo while down") == "while down"
        (error,) = [e for e in await asyncio.wait_for(told, WAIT) if isinstance(e, Error)]
        assert error.retryable
        assert "session store does not answer" in error.message
        redis.start()
        await asyncio.gather(*(node.wait_ready() for node in cluster.nodes))
        assert await say(conv, "echo after") == "after"
        # The store has the whole session again: a resume on another node carries it on.
        for attempt in range(1, 6):
            cut(conv)
            assert await say(conv, f"echo resumed {attempt}") == f"resumed {attempt}"
            if await owner(owners, conv) != first:
                break
        assert await owner(owners, conv) != first
        assert await say(conv, "echo done") == "done"

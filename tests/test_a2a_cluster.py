"""The gateway's A2A server across nodes: two ``gateway serve --a2a`` processes on one
redis-server (tests/cluster.py), each called by the official ``a2a-sdk`` client at its own
URL, as a round-robin load balancer would send a context's messages.

What docs/a2a.md promises of several nodes: a context goes on on whichever node its next
message lands (the session taken over, its history kept), it stays its caller's only, and
``GetTask`` on any node finds a task another node ran; ``CancelTask`` and
``SubscribeToTask`` must reach the node running the task; a message sent to another node
while a task runs takes the session from it (that task fails, saying so).
"""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from a2a.client import Client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from tests.a2a_support import card_client, message, task_text
from tests.cluster import Cluster, Node, running_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # two processes and redis-server: seconds to start

KEY = "a2a-cluster-key-0123456789abcdef"
OTHER_KEY = "a2a-cluster-other-0123456789abcdef"
WAIT = 20.0
"""Seconds any one call may take (a take-over on a busy 2-core machine)."""
LONG = " ".join(f"word{i}" for i in range(100))

SCENARIO = f"""
pace = 0
fallback = "fallback"

[[rules]]
match = '^add (\\d+) (\\d+)$'
calls = [{{ tool = "add", args = {{ a = "{{1|int}}", b = "{{2|int}}" }} }}]

[[results]]
tool = "add"
say = "the sum is {{output.total}}"

[[rules]]
# Only the session that ran `add` knows its total: a new session falls back.
match = '^what was the sum\\?$'
say = "it was {{last.add.output.total}}"

[[rules]]
match = '^echo (?P<t>.*)$'
say = "{{t}}"

[[rules]]
match = '^long$'
pace = 0.05
say = "{LONG}"
"""

AGENT = """
name = "adder"
description = "Adds numbers, and remembers the sum."
a2a = true

[model]
provider = "scripted"
scenario = "scenario.toml"

[[server_tools]]
ref = "tests.data.tools:add"
"""


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(textwrap.dedent(AGENT))
    keys = tmp_path / "keys.txt"
    keys.write_text(f"caller:{KEY}\nother:{OTHER_KEY}\n")
    auth = ["--api-keys-file", str(keys)]
    async with running_cluster(tmp_path, redis.url, count=2, agent=agent, auth=auth) as nodes:
        yield nodes


@asynccontextmanager
async def a2a_client(
    node: Node, key: str = KEY, *, streaming: bool = False
) -> AsyncIterator[Client]:
    """The SDK's client of one node, made from the card that node serves."""
    async with card_client(node.url, key, streaming=streaming, http_timeout=WAIT) as client:
        yield client


async def send(client: Client, text: str, context_id: str = "") -> Task:
    """A blocking send: the task, once it ended."""
    async with asyncio.timeout(WAIT):
        (event,) = [e async for e in client.send_message(message(text, context_id=context_id))]
    assert event.HasField("task"), event
    return event.task


def status_text(task: Task) -> str:
    return "".join(p.text for p in task.status.message.parts)


async def streaming(client: Client, text: str) -> tuple[asyncio.Task[None], list[StreamResponse]]:
    """Send ``text`` streaming; once its first chunk came, the task reading the rest and
    the events so far (more are appended as they come)."""
    seen: list[StreamResponse] = []
    first_chunk = asyncio.Event()

    async def stream() -> None:
        async for event in client.send_message(message(text)):
            seen.append(event)
            if event.HasField("artifact_update"):
                first_chunk.set()

    reading = asyncio.create_task(stream())
    async with asyncio.timeout(WAIT):
        await first_chunk.wait()
    return reading, seen


async def test_a_context_goes_on_on_the_other_node_and_its_tasks_are_found_there(
    cluster: Cluster,
) -> None:
    n1, n2 = cluster.nodes
    async with a2a_client(n1) as one, a2a_client(n2) as two:
        first = await send(one, "add 2 3")
        assert first.status.state == TaskState.TASK_STATE_COMPLETED
        assert task_text(first) == "the sum is 5"
        context_id = first.context_id

        # The next message of the context lands on the other node: same session, its
        # history (the `add` of the first turn) read there.
        second = await send(two, "what was the sum?", context_id)
        assert second.status.state == TaskState.TASK_STATE_COMPLETED
        assert second.context_id == context_id
        assert task_text(second) == "it was 5"
        assert await n2.metric("gateway_sessions_adopted_total") == 1

        # Back and forth: each node goes on from where the other left the context.
        third = await send(one, "add 10 20", context_id)
        assert task_text(third) == "the sum is 30"
        fourth = await send(two, "what was the sum?", context_id)
        assert task_text(fourth) == "it was 30"
        assert await n1.metric("gateway_sessions_adopted_total") == 1
        assert await n2.metric("gateway_sessions_adopted_total") == 2

        # Each node finds the tasks the other ran, ended, with their answer.
        for client, task in ((two, first), (two, third), (one, second), (one, fourth)):
            fetched = await client.get_task(GetTaskRequest(id=task.id))
            assert fetched.status.state == TaskState.TASK_STATE_COMPLETED
            assert fetched.context_id == context_id
            assert task_text(fetched) == task_text(task)
        with pytest.raises(TaskNotFoundError):
            await two.get_task(GetTaskRequest(id=uuid.uuid4().hex))

    # One session all along: opened once, by the first message.
    logged = [line for n in cluster.nodes for line in n.log.read_text().splitlines()]
    assert sum('"a2a_context_opened"' in line for line in logged) == 1


async def test_a_context_and_its_tasks_are_their_callers_only_on_every_node(
    cluster: Cluster,
) -> None:
    n1, n2 = cluster.nodes
    async with a2a_client(n1) as mine, a2a_client(n2, OTHER_KEY) as theirs:
        first = await send(mine, "add 2 3")
        # The other node never saw the context: the store says whose it is.
        refused = await send(theirs, "what was the sum?", first.context_id)
        assert refused.status.state == TaskState.TASK_STATE_REJECTED
        assert "no conversation" in status_text(refused)
        with pytest.raises(TaskNotFoundError):
            await theirs.get_task(GetTaskRequest(id=first.id))
        with pytest.raises(TaskNotFoundError):
            await theirs.cancel_task(CancelTaskRequest(id=first.id))
    async with a2a_client(n2) as mine_there:  # the context is intact for its caller
        second = await send(mine_there, "what was the sum?", first.context_id)
        assert task_text(second) == "it was 5"


async def test_a_task_is_cancelled_on_the_node_running_it_only(cluster: Cluster) -> None:
    n1, n2 = cluster.nodes
    async with (
        a2a_client(n1, streaming=True) as runner,
        a2a_client(n2) as elsewhere,
    ):
        reading, seen = await streaming(runner, "long")
        task_id = seen[0].task.id
        # Another node finds the task running, but cannot stop it: it says so.
        running = await elsewhere.get_task(GetTaskRequest(id=task_id))
        assert running.status.state not in (
            TaskState.TASK_STATE_COMPLETED,
            TaskState.TASK_STATE_CANCELED,
        )
        with pytest.raises(TaskNotCancelableError, match="another gateway node"):
            await elsewhere.cancel_task(CancelTaskRequest(id=task_id))
        # Nor follow it: it has none of its events (refused, not a stream that hangs).
        async with a2a_client(n2, streaming=True) as follower, asyncio.timeout(WAIT):
            with pytest.raises(UnsupportedOperationError, match="another gateway node"):
                async for _ in follower.subscribe(SubscribeToTaskRequest(id=task_id)):
                    pass
        assert not reading.done()
        assert (
            await elsewhere.get_task(GetTaskRequest(id=task_id))
        ).status.state == running.status.state
        cancelled = await runner.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        async with asyncio.timeout(WAIT):
            await reading
        fetched = await elsewhere.get_task(GetTaskRequest(id=task_id))
        assert fetched.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_message_on_another_node_takes_the_context_from_its_running_task(
    cluster: Cluster,
) -> None:
    n1, n2 = cluster.nodes
    async with a2a_client(n1, streaming=True) as runner, a2a_client(n2) as elsewhere:
        reading, seen = await streaming(runner, "long")
        first_task = seen[0].task
        # Not refused as busy (that is one node's table): the session moves to node 2.
        second = await send(elsewhere, "echo me", first_task.context_id)
        assert second.status.state == TaskState.TASK_STATE_COMPLETED
        assert task_text(second) == "me"
        async with asyncio.timeout(WAIT):
            await reading
        last = seen[-1].status_update.status
        assert last.state == TaskState.TASK_STATE_FAILED
        assert "session moved to another node" in "".join(p.text for p in last.message.parts)
        fetched = await elsewhere.get_task(GetTaskRequest(id=first_task.id))
        assert fetched.status.state == TaskState.TASK_STATE_FAILED
    logged = [line for n in cluster.nodes for line in n.log.read_text().splitlines()]
    assert sum('"a2a_context_opened"' in line for line in logged) == 1  # one session

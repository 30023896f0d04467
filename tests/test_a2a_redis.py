"""The gateway's A2A server on a shared store: in-process gateways on a real redis-server.

Contexts and tasks are found through the store (tests/test_a2a_cluster.py runs the same
as processes): a context whose session is gone starts over and says so, a store that does
not answer refuses the task with its reason, and the shared task store keeps a task per
caller.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import Artifact, GetTaskRequest, Part, Task, TaskState, TaskStatus
from a2a.utils.errors import InternalError

from gateway.core.principal import ANONYMOUS
from gateway.edge.a2a_server import BoundedTaskStore, SharedTaskStore
from gateway.edge.a2a_session import ContextRecord, Conversations, Refused, context_name
from gateway.store import MemoryStore, Store
from gateway.store.redis import RedisStore
from tests.redis_server import RedisServer
from tests.test_a2a_server import (
    a2a_client,
    a2a_gateway,
    chunks,
    events_of,
    final_task,
    message,
    statuses,
)

WAIT = 10.0


async def test_a_context_whose_session_is_gone_starts_over_on_another_node(
    redis: RedisServer, tmp_path: Path
) -> None:
    shared = {"store": redis.url, "lease_ttl": 1.0}
    async with (
        a2a_gateway(tmp_path, node_id="node-a", **shared) as a,
        a2a_gateway(tmp_path, node_id="node-b", **shared) as b,
        a2a_client(a) as on_a,
        a2a_client(b) as on_b,
    ):
        first = await events_of(on_a, message("echo before"))
        context_id = first[0].task.context_id
        (session_id,) = a.runtime.drivers
        stored = await b.runtime.store.get_named(context_name(context_id))
        assert stored is not None
        record = msgspec.msgpack.decode(stored, type=ContextRecord)
        assert (record.principal, record.session_id) == ("key:caller", session_id)
        assert record.last_seq > 0
        async with asyncio.timeout(WAIT):
            await a.runtime.end_session(session_id)  # as DELETE /v1/sessions/{id}
        events = await events_of(on_b, message("echo after", context_id=context_id))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        assert "".join(chunks(events)) == "after"
        assert statuses(events)[0] == (
            "a new conversation: the earlier session of this context has ended"
        )
        (new_session,) = b.runtime.drivers
        assert new_session != session_id


async def test_a_store_that_does_not_answer_refuses_the_task(
    redis: RedisServer, tmp_path: Path
) -> None:
    async with (
        a2a_gateway(tmp_path, store=redis.url, lease_ttl=1.0) as gw,
        a2a_client(gw) as client,
    ):
        first = await events_of(client, message("echo hello"))
        context_id = first[0].task.context_id
        redis.stop()
        try:
            # The SDK reads the new task's id from the task store first: a JSON-RPC error
            # that says why.
            with pytest.raises(InternalError, match=r"cannot be read now: .* does not answer"):
                await events_of(client, message("echo again", context_id=context_id))
            # Had the store answered that, the context's lookup refuses the task (a store
            # failing in between).
            with pytest.raises(Refused) as refused:
                await Conversations(gw.runtime).get(context_id, ANONYMOUS)
            assert refused.value.reason.startswith("the conversation cannot be reached now: ")
            assert "does not answer" in refused.value.reason
        finally:
            redis.start()  # empty: the context starts over
        events = await events_of(client, message("echo back", context_id=context_id))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        fetched = await client.get_task(GetTaskRequest(id=events[0].task.id))
        assert fetched.status.state == TaskState.TASK_STATE_COMPLETED


class _Named(User):
    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._name


def _caller(name: str) -> ServerCallContext:
    return ServerCallContext(user=_Named(name))


def _task(task_id: str, state: TaskState, text: str = "") -> Task:
    task = Task(id=task_id, context_id="c", status=TaskStatus(state=state))
    if text:
        task.artifacts.append(Artifact(artifact_id="answer", parts=[Part(text=text)]))
    return task


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_the_shared_task_store_finds_another_nodes_task_for_its_owner_only(
    backend: str, request: pytest.FixtureRequest
) -> None:
    store: Store
    if backend == "memory":
        store = MemoryStore()
    else:
        server: RedisServer = request.getfixturevalue("redis")
        store = RedisStore.from_url(server.url, session_ttl=60, lease_ttl=10)
    try:
        ran_it = SharedTaskStore(BoundedTaskStore(10), store)
        other_node = SharedTaskStore(BoundedTaskStore(10), store)
        alice, bob = _caller("key:alice"), _caller("key:bob")
        await ran_it.save(_task("t1", TaskState.TASK_STATE_WORKING), alice)
        seen = await other_node.get("t1", alice)
        assert seen is not None
        assert seen.status.state == TaskState.TASK_STATE_WORKING
        assert await other_node.running_elsewhere("t1", alice)
        assert not await ran_it.running_elsewhere("t1", alice)
        await ran_it.save(_task("t1", TaskState.TASK_STATE_COMPLETED, "the answer"), alice)
        done = await other_node.get("t1", alice)
        assert done is not None
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert [p.text for p in done.artifacts[0].parts] == ["the answer"]
        assert not await other_node.running_elsewhere("t1", alice)
        assert await other_node.get("t1", bob) is None  # another caller's: not found
        assert await other_node.get("t2", alice) is None
    finally:
        await store.aclose()


async def test_the_shared_task_store_says_when_the_store_does_not_answer(
    tmp_path: Path,
) -> None:
    store = RedisStore.from_url(f"unix://{tmp_path}/none.sock", session_ttl=60, lease_ttl=10)
    try:
        tasks = SharedTaskStore(BoundedTaskStore(10), store)
        alice = _caller("key:alice")
        # A save is kept here (logged): the task goes on, known to this node.
        await tasks.save(_task("t1", TaskState.TASK_STATE_COMPLETED), alice)
        assert await tasks.get("t1", alice) is not None
        with pytest.raises(InternalError, match="cannot be read now"):
            await tasks.get("t2", alice)
    finally:
        await store.aclose()

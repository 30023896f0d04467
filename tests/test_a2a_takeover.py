"""A remote A2A agent's task outlives the gateway node that started it: two ``gateway serve``
processes on one redis-server behind nginx (round robin), the shipped Python SDK, the real
``a2a-sdk`` test agent (tests/a2a_support.py). The node driving the session is SIGKILLed
while the task works; the session resumes on the other node, which re-attaches to the task
(``SubscribeToTask``) from the handle its call kept, and the result reaches the conversation
once. The task is never started twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from client_sdk import Conversation, connect
from gateway.wire.v1 import ResponseDone, ServerMsg, TextDelta, ToolStatus
from tests.a2a_support import Remote, a2a_agent, write_agent
from tests.cluster import behind_nginx, collect, owner, owners_store, running_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # processes, nginx and a kill: seconds

WAIT = 20.0
"""Seconds any one step may take (a node's death and a resume included)."""


@pytest.fixture
async def remote(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Remote]:
    monkeypatch.setenv("HELPER_TOKEN", "s3cret")  # the nodes' environment is copied from here
    async with a2a_agent() as served:
        yield served


def settled(tool: str, call_status: str) -> Callable[[list[ServerMsg]], bool]:
    """Done once a call of ``tool`` settled as ``call_status`` and a response ended after it."""

    def done(events: list[ServerMsg]) -> bool:
        at = next(
            (
                i
                for i, e in enumerate(events)
                if isinstance(e, ToolStatus) and (e.tool, e.status) == (tool, call_status)
            ),
            None,
        )
        return at is not None and any(isinstance(e, ResponseDone) for e in events[at:])

    return done


def progressed(events: list[ServerMsg]) -> bool:
    return any(isinstance(e, ToolStatus) and e.status == "progress" for e in events)


@pytest.mark.parametrize("execution", ["async", "sync"])
async def test_a_node_killed_during_a_remote_task_the_result_still_arrives_once(
    redis: RedisServer, remote: Remote, tmp_path: Path, execution: str
) -> None:
    """``async``: the call is pending, the conversation goes on, the completion comes
    through the other node. ``sync``: the turn waits for the call; the other node follows
    the task and the turn ends with its result."""
    options = 'execution = "async"' if execution == "async" else "timeout = 60"
    agent = write_agent(tmp_path, remote.url, "sync_budget = 60\n", long_report=options)
    async with (
        running_cluster(tmp_path, redis.url, count=2, agent=agent) as cluster,
        owners_store(redis.url) as owners,
        behind_nginx(cluster, tmp_path, sticky=False) as front,
        connect(front) as conv,
    ):
        await conv.start()
        started = await collect(conv, progressed)
        answered = await collect(conv, settled("long_report", "completed"))
        if execution == "async":
            async with asyncio.timeout(WAIT):
                said = "".join([d async for d in conv.say("report on sales")])
            assert said == "Working on it."
            turn = None
        else:  # the turn waits for the call: its text is read in the background
            turn = asyncio.create_task(_say(conv, "report on sales"))
        await asyncio.wait_for(started, WAIT)
        killed = await owner(owners, conv)
        cluster.node(killed).kill()

        if execution == "async":  # the conversation goes on through the other node
            async with asyncio.timeout(WAIT):
                echoed = "".join([d async for d in conv.say("echo still here")])
            assert "still here" in echoed
        async with asyncio.timeout(WAIT):
            await remote.subscribed.wait()  # the other node re-attached to the task
        remote.release.set()

        events = await asyncio.wait_for(answered, WAIT)
        completed = [
            e
            for e in events
            if isinstance(e, ToolStatus) and (e.tool, e.status) == ("long_report", "completed")
        ]
        assert [s.result for s in completed] == ["report on sales"]
        said_after = "".join(
            e.delta for e in events[events.index(completed[0]) :] if isinstance(e, TextDelta)
        )
        if turn is not None:  # the turn's next step answers the result
            said = await asyncio.wait_for(turn, WAIT)
            assert said == 'long report returned "report on sales".'
        else:  # a completion: a response of its own
            assert said_after == "The report is ready."
        assert await owner(owners, conv) != killed
        assert conv.reconnects >= 1
    assert remote.reports == ["sales"]  # the task ran once
    assert not remote.cancelled.is_set()


async def _say(conv: Conversation, text: str) -> str:
    return "".join([delta async for delta in conv.say(text)])

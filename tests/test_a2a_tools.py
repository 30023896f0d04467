"""Remote A2A agents as tools, over real sockets: a real ``a2a-sdk`` server started here
(tests/a2a_support.py: a quick skill that answers with a message, a long one that works as a
task with progress, one that asks for input, one that fails) and a gateway whose agent file
names it in ``[[a2a_agents]]``. Its tasks outliving a gateway node: tests/test_a2a_takeover.py."""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types.a2a_pb2 import Artifact, Part, StreamResponse, TaskArtifactUpdateEvent
from structlog.testing import capture_logs

from gateway.__main__ import _parser
from gateway.agent.cli import run_tools_command
from gateway.errors import ConfigError, ToolError
from gateway.tools.a2a.backend import A2ATools
from gateway.tools.a2a.reply import MAX_RESULT_CHARS, TaskFollower
from gateway.tools.entry import A2AAgentEntry
from gateway.tools.python import Progress
from gateway.wire.v1 import ResponseCancel, ResponseCreated, ResponseDone, ToolStatus, UserMessage
from tests.a2a_support import Remote, a2a_agent, write_agent
from tests.support import say, serving, session, streamed_text


@pytest.fixture
async def remote(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Remote]:
    monkeypatch.setenv("HELPER_TOKEN", "s3cret")
    async with a2a_agent() as served:
        yield served


def statuses(events: list[Any]) -> list[ToolStatus]:
    return [e for e in events if isinstance(e, ToolStatus)]


async def test_each_skill_is_a_tool_and_a_task_maps_onto_a_tool_call(
    remote: Remote, tmp_path: Path
) -> None:
    agent = write_agent(tmp_path, remote.url)
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, created):
        offered = {t.name: t.execution for t in created.tools}
        assert offered == {
            "quick_echo": "sync",
            "long_report": "async",
            "failing": "sync",
            "book_table": "sync",
        }

        # The quick skill answers with a message, inside the turn.
        events = await say(conn, "echo hello there")
        done = statuses(events)
        assert [(s.tool, s.status) for s in done] == [
            ("quick_echo", "running"),
            ("quick_echo", "completed"),
        ]
        assert done[-1].result == "echo: hello there"

        # The failing skill: the task's FAILED status, with its reason.
        events = await say(conn, "fail")
        failed = statuses(events)[-1]
        assert (failed.tool, failed.status) == ("failing", "failed")
        assert failed.error == "the remote task failed: the disk is full"

        # The long skill: pending at once, its progress, then its artifact.
        events = await say(conn, "report on sales")
        assert [(s.tool, s.status) for s in statuses(events)] == [("long_report", "pending")]
        assert streamed_text(events) == "Working on it."
        progress: list[Any] = []
        while len(progress) < 2:
            event = await conn.recv()
            if isinstance(event, ToolStatus) and event.status == "progress":
                progress.append(event.progress)
        assert progress == [
            {"state": "working", "message": "reading"},
            {"state": "working", "message": "writing"},
        ]
        remote.release.set()
        later = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        completed = statuses(later)[-1]
        assert (completed.tool, completed.status) == ("long_report", "completed")
        assert completed.result == "report on sales"
        assert streamed_text(later) == "The report is ready."
    # The card and every call carried the header the agent file names, from the environment.
    assert remote.authorizations
    assert set(remote.authorizations) == {"Bearer s3cret"}


async def test_cancelling_a_call_cancels_the_remote_task(remote: Remote) -> None:
    backend = A2ATools(A2AAgentEntry(name="helper", url=remote.url))
    await backend.start()
    try:
        progress: list[Any] = []
        started = asyncio.Event()

        def report(payload: Any) -> None:
            progress.append(payload)
            started.set()

        call = asyncio.create_task(backend.call("long_report", {"message": "x"}, report))
        async with asyncio.timeout(10):
            await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        async with asyncio.timeout(10):
            await remote.cancelled.wait()
    finally:
        await backend.aclose()


async def test_an_unreachable_card_fails_startup_or_warns_when_optional(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    backend = A2ATools(A2AAgentEntry(name="ghost", url=url, connect_timeout=2))
    with pytest.raises(ConfigError) as raised:
        await backend.start()
    await backend.aclose()
    assert f"{url}/.well-known/agent-card.json" in str(raised.value)

    (tmp_path / "scenario.toml").write_text('fallback = "hi"\n')
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'name = "patient"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
        f'[[a2a_agents]]\nname = "ghost"\nurl = "{url}"\noptional = true\n'
    )
    with capture_logs() as logs:
        async with serving(agent=str(agent)) as gateway, session(gateway.url) as (_, created):
            assert created.tools == []
    unavailable = [e for e in logs if e["event"] == "tool_backend_unavailable"]
    assert unavailable
    assert unavailable[0]["backend"] == "a2a:ghost"


async def test_the_cli_lists_and_tests_an_a2a_tool(remote: Remote, tmp_path: Path) -> None:
    agent = str(write_agent(tmp_path, f"{remote.url}/.well-known/agent-card.json"))
    out = io.StringIO()
    parsed = _parser().parse_args(["tools", "list", "--agent", agent, "--json"])
    assert await run_tools_command(parsed, out) == 0
    listed = {row["name"]: row for row in json.loads(out.getvalue())}
    assert listed["quick_echo"]["backend"] == "a2a:helper"
    assert listed["quick_echo"]["input"] == "message: string, task_id?: string"

    out = io.StringIO()
    parsed = _parser().parse_args(
        ["tools", "test", "quick_echo", "--input", '{"message": "hi"}', "--agent", agent, "--json"]
    )
    assert await run_tools_command(parsed, out) == 0
    assert json.loads(out.getvalue())["output"] == "echo: hi"

    out = io.StringIO()
    parsed = _parser().parse_args(
        ["tools", "test", "failing", "--input", '{"message": "x"}', "--agent", agent, "--json"]
    )
    assert await run_tools_command(parsed, out) == 1
    assert "the disk is full" in json.loads(out.getvalue())["error"]


async def test_the_http_console_lists_and_runs_an_a2a_tool(remote: Remote, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, remote.url)
    async with serving(agent=str(agent)) as gateway:
        base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
        async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
            listed = {t["name"]: t for t in (await http.get("/v1/tools")).json()["tools"]}
            ran = await http.post("/v1/tools/quick_echo/test", json={"message": "hi"})
            failed = await http.post("/v1/tools/failing/test", json={"message": "x"})
    assert listed["long_report"]["backend"] == "a2a:helper"
    assert ran.json()["output"] == "echo: hi"
    assert "the disk is full" in failed.json()["error"]


async def test_an_agent_that_cannot_stream_is_polled_for_its_task() -> None:
    """A card without streaming: each call is one ``SendMessage`` that answers at once (with
    the reply, or the task as it starts), and a task is polled with ``GetTask`` until it
    completes or fails."""
    async with a2a_agent(streaming=False) as remote:
        backend = A2ATools(A2AAgentEntry(name="helper", url=remote.url))
        await backend.start()
        try:
            assert await backend.call("quick_echo", {"message": "hi"}, print) == "echo: hi"
            call = asyncio.create_task(backend.call("long_report", {"message": "q3"}, print))
            remote.release.set()
            async with asyncio.timeout(10):
                assert await call == "report on q3"
            with pytest.raises(ToolError, match="the disk is full"):
                await backend.call("failing", {"message": "please"}, print)
        finally:
            await backend.aclose()


async def test_a_sync_call_whose_task_keeps_working_turns_async(
    remote: Remote, tmp_path: Path
) -> None:
    """Past ``sync_budget`` a sync call's task still works: the call turns pending, the
    turn ends, and the task's result comes later as a completion."""
    agent = write_agent(tmp_path, remote.url, "sync_budget = 0.2\n", long_report="timeout = 60")
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, created):
        assert {t.name: t.execution for t in created.tools}["long_report"] == "sync"
        events = await say(conn, "report on q3")
        done = statuses(events)
        assert [s.status for s in done if s.status != "progress"] == ["running", "pending"]
        assert streamed_text(events) == "Working on it."
        remote.release.set()
        later = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        completed = statuses(later)[-1]
        assert (completed.call_id, completed.status) == (done[0].call_id, "completed")
        assert completed.result == "report on q3"
        assert streamed_text(later) == "The report is ready."
    assert remote.reports == ["q3"]


async def test_a_question_of_the_remote_agent_round_trips_through_the_user(
    remote: Remote, tmp_path: Path
) -> None:
    """A task in INPUT_REQUIRED: the model gets the question and the task's id, asks the
    user, and sends the answer into the same task, which completes."""
    agent = write_agent(tmp_path, remote.url)
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, _):
        events = await say(conn, "book a table")
        asked = statuses(events)[-1]
        assert (asked.tool, asked.status) == ("book_table", "completed")
        assert isinstance(asked.result, dict)
        assert asked.result["status"] == "input_required"
        assert asked.result["question"] == "For how many?"
        assert streamed_text(events) == "For how many?"

        events = await say(conn, "for 4")
        answered = statuses(events)[-1]
        assert answered.status == "completed"
        assert answered.result == "booked for 4"
        assert streamed_text(events) == "Done: booked for 4."

        # A model that leaves the task's id out still answers the question it relayed:
        # the session's next call of the tool goes into the task that asked.
        events = await say(conn, "book a table")
        assert streamed_text(events) == "For how many?"
        events = await say(conn, "3 of us")
        assert streamed_text(events) == "Done: booked for 3."
        # Answered, it is forgotten: the next call starts a task of its own.
        events = await say(conn, "book a table")
        assert streamed_text(events) == "For how many?"


@pytest.mark.parametrize("how", ["response.cancel", "deadline"])
async def test_cancelling_a_call_in_a_conversation_cancels_the_remote_task(
    remote: Remote, tmp_path: Path, how: str
) -> None:
    timeout = 1 if how == "deadline" else 60
    agent = write_agent(tmp_path, remote.url, long_report=f"timeout = {timeout}")
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, _):
        await conn.send(UserMessage(text="report on q4"))
        started = await conn.recv_until(
            lambda e: isinstance(e, ToolStatus) and e.status == "progress"
        )
        if how == "response.cancel":
            response_id = next(e.response_id for e in started if isinstance(e, ResponseCreated))
            await conn.send(ResponseCancel(response_id=response_id))
        ended = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        final = statuses(ended)[-1]
        assert final.status == ("cancelled" if how == "response.cancel" else "failed")
        async with asyncio.timeout(10):
            await remote.cancelled.wait()


@pytest.mark.parametrize("streaming", [True, False], ids=["subscribe", "poll"])
async def test_a_call_is_followed_again_from_its_kept_handle(streaming: bool) -> None:
    """What a node that took a session over does: the task a call kept as its handle is
    followed from where it stands (``SubscribeToTask``, or ``GetTask`` polls for an agent
    that cannot stream) to its result, and is not started again."""
    async with a2a_agent(streaming=streaming) as remote:
        started = A2ATools(A2AAgentEntry(name="helper", url=remote.url))
        await started.start()
        handles: list[dict[str, Any]] = []
        kept = asyncio.Event()

        def keep(handle: dict[str, Any]) -> None:
            handles.append(handle)
            kept.set()

        progress = Progress(lambda _: None, keep=keep)
        first = asyncio.create_task(started.call("long_report", {"message": "q1"}, progress))
        async with asyncio.timeout(10):
            await kept.wait()  # the handle is kept as the task starts
        await started.aclose()  # as a node that stops: the remote task goes on
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert not remote.cancelled.is_set()

        resumed = A2ATools(A2AAgentEntry(name="helper", url=remote.url))
        await resumed.start()
        try:
            call = asyncio.create_task(resumed.resume("long_report", handles[0], print))
            if streaming:  # released once followed, so that the events come by the stream
                async with asyncio.timeout(10):
                    await remote.subscribed.wait()
            remote.release.set()
            async with asyncio.timeout(10):
                assert await call == "report on q1"
            assert remote.reports == ["q1"]
            with pytest.raises(ToolError, match="no remote task"):
                await resumed.resume("long_report", {}, print)
        finally:
            await resumed.aclose()


async def test_an_answer_into_a_task_the_agent_does_not_know_fails_the_call(
    remote: Remote,
) -> None:
    """A model that makes a task id up (or keeps one too long) gets the agent's reason."""
    backend = A2ATools(A2AAgentEntry(name="helper", url=remote.url))
    await backend.start()
    try:
        with pytest.raises(ToolError, match="Task made-up not found"):
            await backend.call("book_table", {"message": "4", "task_id": "made-up"}, print)
        # A task that ended takes no more answers either.
        asked = await backend.call("book_table", {"message": "tonight"}, print)
        assert asked["status"] == "input_required"
        done = await backend.call(
            "book_table", {"message": "2", "task_id": asked["task_id"]}, print
        )
        assert done == "booked for 2"
        with pytest.raises(ToolError, match="terminal state"):
            await backend.call("book_table", {"message": "3", "task_id": asked["task_id"]}, print)
    finally:
        await backend.aclose()


def test_an_answer_past_the_bound_fails_the_call_before_it_fills_memory() -> None:
    """``TaskFollower`` alone (no network): artifact chunks past ``MAX_RESULT_CHARS`` fail
    the call; a chunk that replaces an artifact counts instead of the old text."""
    follower = TaskFollower(print)
    chunk = "x" * 2**20

    def update(text: str, *, append: bool) -> StreamResponse:
        return StreamResponse(
            artifact_update=TaskArtifactUpdateEvent(
                task_id="t",
                artifact=Artifact(artifact_id="a", parts=[Part(text=text)]),
                append=append,
            )
        )

    for _ in range(20):  # replaced each time: never more than one chunk kept
        assert follower.feed(update(chunk, append=False)) == (False, None)
    for _ in range(MAX_RESULT_CHARS // len(chunk) - 1):  # with the one kept: at the bound
        assert follower.feed(update(chunk, append=True)) == (False, None)
    with pytest.raises(ToolError, match="over 8 Mi characters"):
        follower.feed(update(chunk, append=True))

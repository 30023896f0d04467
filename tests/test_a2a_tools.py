"""Remote A2A agents as tools, over real sockets: a real ``a2a-sdk`` server started here
(a quick skill that answers with a message, a long one that works as a task with progress,
one that fails) and a gateway whose agent file names it in ``[[a2a_agents]]``."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from a2a.helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from starlette.applications import Starlette
from structlog.testing import capture_logs

from gateway.__main__ import _parser
from gateway.agent.cli import run_tools_command
from gateway.errors import ConfigError, ToolError
from gateway.tools.a2a.backend import A2ATools
from gateway.tools.entry import A2AAgentEntry
from gateway.wire.v1 import ResponseDone, ToolStatus
from tests.support import say, serving, session, streamed_text


@dataclass
class Remote:
    """The test agent: what it was sent, and the gate of its long task."""

    url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    authorizations: list[str] = field(default_factory=list)


class HelperExecutor(AgentExecutor):
    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        skill = message.metadata["skill_id"]
        text = context.get_user_input()
        if skill == "quick-echo":
            await event_queue.enqueue_event(new_text_message(f"echo: {text}"))
            return
        task = new_task_from_user_message(message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if skill == "failing":
            await updater.failed(updater.new_agent_message([Part(text="the disk is full")]))
            return
        for step in ("reading", "writing"):
            await updater.start_work(updater.new_agent_message([Part(text=step)]))
        await self.remote.release.wait()
        await updater.add_artifact([Part(text=f"report on {text}")], name="report")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.remote.cancelled.set()
        assert context.task_id is not None
        assert context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def card(url: str, *, streaming: bool = True) -> AgentCard:
    return AgentCard(
        name="helper",
        description="A test agent.",
        version="1.0",
        supported_interfaces=[
            AgentInterface(url=f"{url}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="quick-echo",
                name="Echo",
                description="Says it back.",
                examples=["echo hello"],
                tags=["test"],
            ),
            AgentSkill(
                id="long_report", name="Report", description="Writes a report.", tags=["test"]
            ),
            AgentSkill(id="failing", name="Fail", description="Always fails.", tags=["test"]),
        ],
    )


@asynccontextmanager
async def a2a_agent(*, streaming: bool = True) -> AsyncIterator[Remote]:
    """The test agent served by uvicorn in this loop, on a free port (``streaming``: what
    its card says it can)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    remote = Remote(url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    agent_card = card(remote.url, streaming=streaming)
    handler = DefaultRequestHandler(
        agent_executor=HelperExecutor(remote),
        task_store=InMemoryTaskStore(),
        agent_card=agent_card,
    )
    app = Starlette(
        routes=[
            *create_agent_card_routes(agent_card),
            *create_jsonrpc_routes(handler, rpc_url="/"),
        ]
    )

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            remote.authorizations.append(headers.get(b"authorization", b"").decode())
        await app(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(recording, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield remote
    finally:
        remote.release.set()
        server.should_exit = True
        await task
        sock.close()


SCENARIO = """
pace = 0
fallback = "Ask me."

[[rules]]
match = '^echo (?P<t>.*)$'
calls = [{ tool = "quick_echo", args = { message = "{t}" } }]

[[rules]]
match = '^report on (?P<t>.*)$'
calls = [{ tool = "long_report", args = { message = "{t}" } }]

[[rules]]
match = '^fail$'
calls = [{ tool = "failing", args = { message = "please" } }]

[[results]]
tool = "long_report"
when = "pending"
say = "Working on it."

[[completions]]
tool = "long_report"
say = "The report is ready."
"""


def write_agent(tmp_path: Path, url: str, extra: str = "") -> Path:
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(
        textwrap.dedent(
            f"""
            name = "delegator"
            [model]
            provider = "scripted"
            scenario = "scenario.toml"

            [[a2a_agents]]
            name = "helper"
            url = "{url}"
            headers = {{ Authorization = "Bearer ${{HELPER_TOKEN}}" }}
            tool_options.long_report = {{ execution = "async" }}
            """
        )
        + extra
    )
    return agent


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
        assert offered == {"quick_echo": "sync", "long_report": "async", "failing": "sync"}

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
    assert listed["quick_echo"]["input"] == "message: string"

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


async def test_an_agent_that_cannot_stream_answers_each_skill_through_one_send() -> None:
    """A card without streaming: each call is one blocking ``SendMessage``, which answers
    with the reply, the completed task's artifacts, or its failure."""
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

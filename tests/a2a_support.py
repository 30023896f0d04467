"""A real ``a2a-sdk`` agent for the tests of the gateway's A2A tools, served by uvicorn on a
free port in the test's loop: a quick skill that answers with a message, a long one that
works as a task with progress until the test releases it, one that asks for input, one that
fails; and the agent file of a gateway that names it in ``[[a2a_agents]]``."""

from __future__ import annotations

import asyncio
import socket
import textwrap
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
)
from starlette.applications import Starlette

__all__ = ["SCENARIO", "Remote", "a2a_agent", "card_client", "message", "task_text", "write_agent"]


@dataclass
class Remote:
    """The test agent: what it was sent, and the gate of its long task."""

    url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    authorizations: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    """What each run of the long task was asked (a task run twice shows here twice)."""
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)
    """Someone re-attached to a task (``SubscribeToTask``)."""


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
        if skill == "book-table":
            await self.book(context, event_queue, text)
            return
        task = new_task_from_user_message(message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if skill == "failing":
            await updater.failed(updater.new_agent_message([Part(text="the disk is full")]))
            return
        self.remote.reports.append(text)
        for step in ("reading", "writing"):
            await updater.start_work(updater.new_agent_message([Part(text=step)]))
        await self.remote.release.wait()
        await updater.add_artifact([Part(text=f"report on {text}")], name="report")
        await updater.complete()

    async def book(self, context: RequestContext, event_queue: EventQueue, text: str) -> None:
        """Asks how many people first; the answer, sent into the same task, books."""
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            await updater.requires_input(updater.new_agent_message([Part(text="For how many?")]))
            return
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.add_artifact([Part(text=f"booked for {text}")], name="booking")
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
            AgentSkill(id="book-table", name="Book", description="Books a table.", tags=["test"]),
        ],
    )


class _Handler(DefaultRequestHandler):
    """The SDK's handler, telling the test when a client re-attaches to a task."""

    def __init__(self, remote: Remote, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._remote = remote

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        self._remote.subscribed.set()
        async for event in super().on_subscribe_to_task(params, context):
            yield event


@asynccontextmanager
async def a2a_agent(*, streaming: bool = True) -> AsyncIterator[Remote]:
    """The test agent served by uvicorn in this loop, on a free port (``streaming``: what
    its card says it can)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    remote = Remote(url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    agent_card = card(remote.url, streaming=streaming)
    handler = _Handler(
        remote,
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

[[rules]]
match = '^book a table$'
calls = [{ tool = "book_table", args = { message = "a table tonight" } }]

[[rules]]
match = '^for (?P<n>[0-9]+)$'
[[rules.calls]]
tool = "book_table"
args = { message = "{n}", task_id = "{last.book_table.output.task_id}" }

[[rules]]
match = '^(?P<n>[0-9]+) of us$'
calls = [{ tool = "book_table", args = { message = "{n}" } }]

[[results]]
tool = "book_table"
when = "output.question"
say = "{output.question}"

[[results]]
tool = "book_table"
say = "Done: {output}."

[[results]]
tool = "long_report"
when = "pending"
say = "Working on it."

[[completions]]
tool = "long_report"
say = "The report is ready."
"""


def write_agent(
    tmp_path: Path, url: str, extra: str = "", *, long_report: str = 'execution = "async"'
) -> Path:
    """The delegating agent; ``extra`` goes in its ``[[a2a_agents]]`` entry, ``long_report``
    in the long skill's ``tool_options``."""
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
            tool_options.long_report = {{ {long_report} }}
            """
        )
        + extra
    )
    return agent


# ------------------------------------------------- the official client, against a gateway


@asynccontextmanager
async def card_client(
    base_url: str, key: str | None, *, streaming: bool, http_timeout: float = 30.0
) -> AsyncIterator[Client]:
    """The SDK's client of the agent served at ``base_url``, made from the card it serves
    (read without a key); its calls carry ``key`` as the bearer credential."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with httpx.AsyncClient(headers=headers, timeout=http_timeout, trust_env=False) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        yield ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)


def message(text: str, *, context_id: str = "", skill: str | None = None) -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            role=Role.ROLE_USER,
            message_id=uuid.uuid4().hex,
            context_id=context_id,
            parts=[Part(text=text)],
            # A2A has no field for the skill: the metadata carries it, as the gateway's own
            # A2A tools send it.
            metadata={"skill_id": skill} if skill is not None else None,
        )
    )


def task_text(task: Task) -> str:
    """The text of a task's artifacts, joined."""
    return "".join(p.text for a in task.artifacts for p in a.parts)

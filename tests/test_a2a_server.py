"""The gateway's agent served over A2A, over real sockets, driven by the official ``a2a-sdk``
client: the card (skills from tools, the bearer scheme), streamed and blocking answers, API
keys, a context's history, an async tool, client functions, ``CancelTask``, bad requests."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client
from a2a.client.errors import A2AClientError
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import TaskNotFoundError
from structlog.testing import capture_logs

from gateway.__main__ import _parser
from gateway.config import from_env
from gateway.core.transcript import UserTurn
from gateway.edge.a2a_server import BoundedTaskStore
from gateway.edge.a2a_session import NO_APP
from gateway.wire.v1 import ResponseDone, ToolStatus
from tests.a2a_support import card_client, message, task_text
from tests.data.tools import gate, reset_gates
from tests.support import Gateway, say, serving, session, streamed_text

KEY = "a2a-caller-key-0123456789abcdef"
OTHER_KEY = "a2a-other-key-0123456789abcdef"
AUTH: dict[str, Any] = {
    "no_auth": False,
    "api_keys": f"caller:{KEY},other:{OTHER_KEY}",
    "token_secret": "s" * 40,
}
LONG = " ".join(f"word{i}" for i in range(200))

SCENARIO = f"""
pace = 0
fallback = "fallback"

[[rules]]
match = '^echo (?P<t>.*)$'
say = "{{t}}"

[[rules]]
match = '^stream$'
pace = 0.01
say = "one two three four five six seven eight"

[[rules]]
match = '^long$'
pace = 0.05
say = "{LONG}"

[[rules]]
match = '^order (\\w+)$'
calls = [{{ tool = "lookup_order", args = {{ order_id = "{{1}}" }} }}]

[[rules]]
match = '^add (\\d+) (\\d+)$'
calls = [{{ tool = "add", args = {{ a = "{{1|int}}", b = "{{2|int}}" }} }}]

[[results]]
tool = "add"
say = "the sum is {{output.total}}"

[[rules]]
match = '^risky$'
calls = [{{ tool = "explode" }}]

[[results]]
tool = "explode"
say = "it ran"
on_error = "not done: {{error}}"

[[rules]]
match = '^device$'
calls = [{{ tool = "device_a" }}]

[[results]]
tool = "lookup_order"
when = "pending"
say = "looking up {{args.order_id}}"

[[completions]]
tool = "lookup_order"
say = "order {{output.order_id}} is {{output.status}}"

[[results]]
tool = "device_a"
say = "the app answered"
on_error = "the app could not: {{error}}"
"""

AGENT = """
name = "helper"
description = "Answers questions and looks orders up."
a2a = true
suggestions = ["Where is my order 42?"]

[model]
provider = "scripted"
scenario = "scenario.toml"

[[server_tools]]
ref = "tests.data.tools:add"

[[server_tools]]
ref = "tests.data.tools:lookup_order"

[[server_tools]]
ref = "tests.data.tools:explode"
confirm = true

[[client_functions]]
name = "device_a"
description = "Client function A."
timeout = 10
"""


def write_agent(tmp_path: Path) -> Path:
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(textwrap.dedent(AGENT))
    return agent


def base_url(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.port}"


@asynccontextmanager
async def a2a_gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Gateway]:
    async with serving(**{**AUTH, "agent": str(write_agent(tmp_path)), **overrides}) as gw:
        yield gw


@asynccontextmanager
async def a2a_client(
    gw: Gateway, *, key: str | None = KEY, streaming: bool = True
) -> AsyncIterator[Client]:
    async with card_client(base_url(gw), key, streaming=streaming) as client:
        yield client


async def events_of(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    async with asyncio.timeout(20):
        return [event async for event in client.send_message(request)]


def final_task(events: list[StreamResponse]) -> tuple[TaskState, str]:
    """The state the events end in, and its status message's text."""
    for event in reversed(events):
        status = (
            event.status_update.status
            if event.HasField("status_update")
            else event.task.status
            if event.HasField("task")
            else None
        )
        if status is not None:
            said = "".join(p.text for p in status.message.parts)
            return status.state, said
    raise AssertionError(f"no status in {events}")


def chunks(events: list[StreamResponse]) -> list[str]:
    return [
        "".join(p.text for p in e.artifact_update.artifact.parts)
        for e in events
        if e.HasField("artifact_update")
    ]


def statuses(events: list[StreamResponse]) -> list[str]:
    return [
        "".join(p.text for p in e.status_update.status.message.parts)
        for e in events
        if e.HasField("status_update")
        and e.status_update.status.state == TaskState.TASK_STATE_WORKING
    ]


async def test_the_card_lists_the_tools_as_skills_and_the_bearer_scheme(tmp_path: Path) -> None:
    async with (
        a2a_gateway(tmp_path) as gw,
        httpx.AsyncClient(base_url=base_url(gw), trust_env=False) as http,
    ):
        # Readable without a key.
        card: AgentCard = await A2ACardResolver(http, base_url(gw)).get_agent_card()
    assert card.name == "helper"
    assert card.description.startswith("Answers questions and looks orders up.")
    assert "device_a" in card.description  # left out, and said so
    assert card.capabilities.streaming
    assert list(card.default_input_modes) == ["text/plain"]
    assert list(card.default_output_modes) == ["text/plain"]
    (interface,) = card.supported_interfaces
    assert (interface.url, interface.protocol_binding) == (f"{base_url(gw)}/a2a", "JSONRPC")
    skills = {s.id: s for s in card.skills}
    assert set(skills) == {"talk-to-agent", "add", "lookup_order", "explode"}
    assert list(skills["explode"].tags) == ["tool", "sync", "needs-approval"]
    assert skills["lookup_order"].description == "Look an order up (async, delivered when idle)."
    assert list(skills["lookup_order"].tags) == ["tool", "async"]
    assert skills["add"].name == "Add"
    assert list(skills["talk-to-agent"].examples) == ["Where is my order 42?"]
    scheme = card.security_schemes["bearer"].http_auth_security_scheme
    assert scheme.scheme == "bearer"
    assert [list(r.schemes) for r in card.security_requirements] == [["bearer"]]


async def test_a_streamed_answer_comes_in_chunks_then_completes(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw) as client:
        events = await events_of(client, message("stream"))
    pieces = chunks(events)
    assert len(pieces) >= 3  # streamed as generated, not in one piece at the end
    assert "".join(pieces) == "one two three four five six seven eight"
    assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
    # Every chunk after the first appends to the one answer artifact.
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert [u.append for u in updates] == [False] + [True] * (len(updates) - 1)
    assert {u.artifact.artifact_id for u in updates} == {"answer"}


async def test_a_blocking_send_returns_the_completed_task(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw, streaming=False) as client:
        events = await events_of(client, message("echo hello over a2a"))
        assert len(events) == 1
        task = events[0].task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task_text(task) == "hello over a2a"
        assert len(task.artifacts[0].parts) == 1  # not streamed: the answer whole
        fetched = await client.get_task(GetTaskRequest(id=task.id))
        assert fetched.status.state == TaskState.TASK_STATE_COMPLETED
        assert task_text(fetched) == "hello over a2a"


async def test_every_call_needs_an_api_key_but_the_card_does_not(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path) as gw:
        for key in (None, "not-a-key-of-this-gateway"):
            async with a2a_client(gw, key=key) as client:  # the card: read without a key
                with pytest.raises(A2AClientError, match="401"):
                    await events_of(client, message("echo hi"))
        async with httpx.AsyncClient(trust_env=False) as http:
            refused = await http.post(
                f"{base_url(gw)}/a2a",
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
            )
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert gw.runtime.drivers == {}  # no session was opened for the refused calls
        async with a2a_client(gw) as client:
            events = await events_of(client, message("echo hi"))
            assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED


async def test_a_context_goes_on_with_its_session_and_is_its_callers_only(
    tmp_path: Path,
) -> None:
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw) as client:
        first = await events_of(client, message("echo the first message"))
        context_id = first[0].task.context_id
        assert context_id
        second = await events_of(client, message("echo the second", context_id=context_id))
        assert final_task(second)[0] == TaskState.TASK_STATE_COMPLETED
        assert second[0].task.context_id == context_id
        assert second[0].task.id != first[0].task.id  # one task per message
        # The model saw the first message with the second: the same session, its history.
        said = [i.text for i in gw.model.requests[-1].items if isinstance(i, UserTurn)]
        assert said == ["echo the first message", "echo the second"]
        assert len(gw.runtime.drivers) == 1
        # Another caller naming the context is refused; its session is not touched.
        async with a2a_client(gw, key=OTHER_KEY) as other:
            events = await events_of(other, message("echo mine?", context_id=context_id))
            # Nor does it see, or cancel, the first caller's tasks.
            with pytest.raises(TaskNotFoundError):
                await other.get_task(GetTaskRequest(id=first[0].task.id))
            with pytest.raises(TaskNotFoundError):
                await other.cancel_task(CancelTaskRequest(id=first[0].task.id))
        state, said_why = final_task(events)
        assert state == TaskState.TASK_STATE_REJECTED
        assert "no conversation" in said_why
        assert len(gw.runtime.drivers) == 1


async def test_a_context_whose_session_ended_starts_over(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path, session_ttl=0.2) as gw, a2a_client(gw) as client:
        first = await events_of(client, message("echo before"))
        context_id = first[0].task.context_id
        async with asyncio.timeout(10):
            await gw.runtime.idle.wait()  # no message for session_ttl: the session ended
        events = await events_of(client, message("echo after", context_id=context_id))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        assert events[0].task.context_id == context_id
        said = [i.text for i in gw.model.requests[-1].items if isinstance(i, UserTurn)]
        assert said == ["echo after"]  # a new session: the earlier history is gone


async def test_an_async_tool_keeps_the_task_working_until_its_result(tmp_path: Path) -> None:
    reset_gates()
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw) as client:
        seen: asyncio.Queue[StreamResponse] = asyncio.Queue()

        async def stream() -> None:
            async for event in client.send_message(message("order 42")):
                seen.put_nowait(event)

        reading = asyncio.create_task(stream())
        events: list[StreamResponse] = []
        async with asyncio.timeout(10):
            # The turn's own answer, then the task waits: WORKING, not done.
            while "looking up 42" not in "".join(chunks(events)):
                events.append(await seen.get())
            while not any("started" in s for s in statuses(events)):
                events.append(await seen.get())
        assert not reading.done()
        assert final_task(events)[0] == TaskState.TASK_STATE_WORKING
        assert "lookup_order: started, working in the background" in statuses(events)

        gate("order:42").set()  # the tool finishes: its result's response ends the task
        async with asyncio.timeout(10):
            await reading
        while not seen.empty():
            events.append(seen.get_nowait())
    assert "".join(chunks(events)) == "looking up 42\n\norder 42 is shipped"
    assert "lookup_order: done" in statuses(events)
    assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED


async def test_a_blocking_send_waits_for_an_async_tools_result(tmp_path: Path) -> None:
    reset_gates()
    gate("order:7").set()  # the tool may finish at once: the task still waits for it
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw, streaming=False) as client:
        (event,) = await events_of(client, message("order 7"))
    assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task_text(event.task) == "looking up 7\n\norder 7 is shipped"


async def test_client_functions_cannot_run_over_a2a(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw) as client:
        # Asked for as a skill: refused with the reason.
        events = await events_of(client, message("device please", skill="device_a"))
        state, why = final_task(events)
        assert state == TaskState.TASK_STATE_REJECTED
        assert "runs in the user's app" in why
        # An unknown skill likewise.
        events = await events_of(client, message("x", skill="no_such_skill"))
        assert final_task(events)[0] == TaskState.TASK_STATE_REJECTED
        # Called by the model: the call fails at once, the model reads why, the turn goes on.
        events = await events_of(client, message("device"))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        assert "".join(chunks(events)) == f"the app could not: {NO_APP}"
        # A tool that needs the user's approval is declined: no user takes part.
        events = await events_of(client, message("risky"))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        assert "no user takes part in this A2A conversation" in "".join(chunks(events))
        # A server tool's skill is answered: the model is to call that tool first.
        events = await events_of(client, message("add 2 3", skill="add"))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        assert "".join(chunks(events)) == "the sum is 5"
        assert gw.model.requests[-2].tool_choice == "add"


async def test_cancel_task_cancels_a_long_answer(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path) as gw, a2a_client(gw) as client:
        seen: list[StreamResponse] = []
        first_chunk = asyncio.Event()

        async def stream() -> None:
            async for event in client.send_message(message("long")):
                seen.append(event)
                if event.HasField("artifact_update"):
                    first_chunk.set()

        reading = asyncio.create_task(stream())
        async with asyncio.timeout(10):
            await first_chunk.wait()
        task_id = seen[0].task.id
        with capture_logs() as logs:
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            (driver,) = gw.runtime.drivers.values()
            async with asyncio.timeout(10):
                await reading
                await driver.quiet.wait()  # no response runs
        # The session's response was cancelled (v1 response.cancel), not left to run.
        finished = [e for e in logs if e["event"] == "response_finished"]
        assert [e["status"] for e in finished] == ["cancelled"]
        assert final_task(seen)[0] == TaskState.TASK_STATE_CANCELED
        text = "".join(chunks(seen))
        assert 0 < len(text) < len(LONG)  # cut short
        fetched = await client.get_task(GetTaskRequest(id=task_id))
        assert fetched.status.state == TaskState.TASK_STATE_CANCELED
        # The context takes the next message at once.
        context_id = seen[0].task.context_id
        events = await events_of(client, message("echo again", context_id=context_id))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        assert "".join(chunks(events)) == "again"


async def test_the_callers_session_quota_holds(tmp_path: Path) -> None:
    async with (
        a2a_gateway(tmp_path, max_sessions_per_principal=1) as gw,
        a2a_client(gw) as client,
    ):
        first = await events_of(client, message("echo one"))
        assert final_task(first)[0] == TaskState.TASK_STATE_COMPLETED
        # A new context is a new session: over the caller's quota.
        events = await events_of(client, message("echo two"))
        state, why = final_task(events)
        assert state == TaskState.TASK_STATE_REJECTED
        assert "sessions" in why
        # The first context goes on, in the session it holds.
        context_id = first[0].task.context_id
        events = await events_of(client, message("echo three", context_id=context_id))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED
        # Its usage is metered under the caller's key, as a WebSocket session's is.
        async with httpx.AsyncClient(trust_env=False) as http:
            usage = await http.get(
                f"{base_url(gw)}/v1/usage", headers={"Authorization": f"Bearer {KEY}"}
            )
        assert usage.status_code == 200, usage.text
        assert "caller" in usage.text


async def test_a_message_over_the_limit_fails_its_task(tmp_path: Path) -> None:
    async with a2a_gateway(tmp_path, max_message_chars=20) as gw, a2a_client(gw) as client:
        events = await events_of(client, message("echo " + "x" * 40))
        state, why = final_task(events)
        assert state == TaskState.TASK_STATE_FAILED
        assert why.startswith("message_too_large: ")
        # The context is free again: the next message is answered.
        context_id = events[0].task.context_id
        events = await events_of(client, message("echo short", context_id=context_id))
        assert final_task(events)[0] == TaskState.TASK_STATE_COMPLETED


async def test_the_documented_client_runs_as_shown() -> None:
    """docs/a2a.md's client, run as a reader would, against the demo agent served over A2A
    with the key it names: it prints what the page says."""
    page = (Path(__file__).parents[1] / "docs" / "a2a.md").read_text()
    found = re.search(r"```python\n(?P<code>.*?)```\n\n```text\n(?P<out>.*?)```", page, re.S)
    assert found is not None
    key = "my-backend-key-0123456789abcdef"
    overrides = {**AUTH, "api_keys": f"backend:{key}"}
    async with serving(agent=None, scripted_pace=0.0, a2a=True, **overrides) as demo:
        code = found["code"].replace("http://127.0.0.1:8000", base_url(demo))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await process.communicate()
    assert (process.returncode, err.decode()) == (0, "")
    assert out.decode() == found["out"]


async def test_bad_requests_get_json_rpc_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        a2a_gateway(tmp_path, max_body_size=4096) as gw,
        httpx.AsyncClient(
            base_url=base_url(gw),
            headers={"Authorization": f"Bearer {KEY}", "A2A-Version": "1.0"},
            trust_env=False,
        ) as http,
    ):

        async def rpc(content: bytes) -> dict[str, Any]:
            answer = await http.post(
                "/a2a", content=content, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 200, answer.text
            error: dict[str, Any] = answer.json()["error"]
            return error

        assert (await rpc(b"{not json"))["code"] == -32700
        unknown = b'{"jsonrpc": "2.0", "id": 1, "method": "NoSuchMethod", "params": {}}'
        assert (await rpc(unknown))["code"] == -32601
        bad_params = b'{"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": []}'
        assert (await rpc(bad_params))["code"] == -32602
        oversized = await rpc(b'{"jsonrpc": "2.0", "id": 3, "x": "' + b"a" * 10_000 + b'"}')
        assert oversized["code"] == -32600
        assert "too large" in oversized["message"]
        # Costly or broken bodies are parse errors, checked before the SDK reads them.
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert (await rpc(b"[" * 4000))["code"] == -32700  # past msgspec's depth bound
            not_utf8 = b'{"jsonrpc": "2.0", "id": 4, "method": "' + b"\xff\xfe" + b'"}'
            assert (await rpc(not_utf8))["code"] == -32700
            assert (await rpc(bad_params))["code"] == -32602
            assert (await rpc(unknown))["code"] == -32601
        # A caller's fault is no failure of the gateway's: not logged as one, no traceback.
        sdk = [r for r in caplog.records if r.name.startswith("a2a.")]
        assert sdk  # the SDK did log the faults it saw
        assert all(r.levelno == logging.INFO and r.exc_info is None for r in sdk)


async def test_without_a2a_there_is_no_card(tmp_path: Path) -> None:
    async with serving() as gw, httpx.AsyncClient(trust_env=False) as http:
        assert (await http.get(f"{base_url(gw)}/.well-known/agent-card.json")).status_code == 404
        assert (await http.post(f"{base_url(gw)}/a2a", json={})).status_code in (404, 405)
    # The flag (or its variable) serves any agent file over A2A.
    async with serving(a2a=True) as gw, httpx.AsyncClient(trust_env=False) as http:
        card = await A2ACardResolver(http, base_url(gw)).get_agent_card()
        assert card.name == "test"
        assert not card.security_requirements  # auth is off in this gateway
    assert _parser().parse_args(["serve", "--a2a"]).a2a is True
    assert from_env({"GATEWAY_A2A": "true"}).a2a is True
    assert from_env({}).a2a is False


async def test_a_public_url_names_the_interface(tmp_path: Path) -> None:
    public = "https://agents.example.com/gw"
    async with (
        a2a_gateway(tmp_path, public_url=public + "/") as gw,
        httpx.AsyncClient(trust_env=False) as http,
    ):
        card = await A2ACardResolver(http, base_url(gw)).get_agent_card()
    assert card.supported_interfaces[0].url == f"{public}/a2a"


async def test_the_task_store_keeps_the_newest_tasks_and_every_running_one() -> None:
    store = BoundedTaskStore(max_tasks=2)
    owner = ServerCallContext()

    def task(task_id: str, state: TaskState) -> Task:
        return Task(id=task_id, context_id="c", status=TaskStatus(state=state))

    await store.save(task("running", TaskState.TASK_STATE_WORKING), owner)
    for name in ("a", "b", "c"):
        await store.save(task(name, TaskState.TASK_STATE_COMPLETED), owner)
    kept = {t for t in ("running", "a", "b", "c") if await store.get(t, owner) is not None}
    assert kept == {"running", "c"}


async def test_the_sdks_server_loads_only_when_a2a_is_on() -> None:
    probe = (
        "import sys\n"
        "from gateway.config import Config\n"
        "from gateway.edge.app import create_app\n"
        "create_app(Config(no_auth=True, a2a=sys.argv[1] == 'on'))\n"
        "print(any(m.startswith('a2a.server') for m in sys.modules))\n"
    )
    for switch, loaded in (("off", "False"), ("on", "True")):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", probe, switch, stdout=asyncio.subprocess.PIPE
        )
        async with asyncio.timeout(30):
            out, _ = await process.communicate()
        assert out.decode().split()[-1] == loaded  # after the log lines


DELEGATOR_SCENARIO = """
pace = 0

[[rules]]
match = '^ask (?P<t>.*)$'
calls = [{ tool = "talk_to_agent", args = { message = "{t}" } }]

[[results]]
tool = "talk_to_agent"
say = "The helper says: {output}"

[[rules]]
match = '^track (?P<o>[0-9]+)$'
calls = [{ tool = "lookup_order", args = { message = "order {o}" } }]

[[results]]
tool = "lookup_order"
when = "pending"
say = "The helper is on it."

[[completions]]
tool = "lookup_order"
say = "The helper: {output}"
"""


async def test_one_gateway_calls_another_over_a2a(tmp_path: Path) -> None:
    """The gateway's A2A tools against the gateway's A2A server: the agent as a whole
    answers inside the turn; an async tool over there keeps its task working, so the call
    here turns async past its sync budget and completes later."""
    reset_gates()
    served_dir, calling_dir = tmp_path / "served", tmp_path / "calling"
    served_dir.mkdir()
    calling_dir.mkdir()
    async with a2a_gateway(served_dir) as served:
        (calling_dir / "scenario.toml").write_text(DELEGATOR_SCENARIO)
        agent = calling_dir / "agent.toml"
        agent.write_text(
            'name = "delegator"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
            "[[a2a_agents]]\n"
            'name = "helper"\n'
            f'url = "{base_url(served)}"\n'
            f'headers = {{ Authorization = "Bearer {KEY}" }}\n'
            'skills = ["talk-to-agent", "lookup_order"]\n'
            "sync_budget = 0.3\n"
        )
        async with (
            serving(agent=str(agent)) as calling,
            session(calling.url) as (conn, created),
        ):
            assert {t.name for t in created.tools} == {"talk_to_agent", "lookup_order"}
            events = await say(conn, "ask echo hello there")
            assert streamed_text(events) == "The helper says: hello there"

            events = await say(conn, "track 42")
            tracked = [e for e in events if isinstance(e, ToolStatus)]
            assert [s.status for s in tracked if s.status != "progress"] == [
                "running",
                "pending",
            ]
            assert streamed_text(events) == "The helper is on it."
            gate("order:42").set()
            later = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
            done = [e for e in later if isinstance(e, ToolStatus) and e.status == "completed"]
            assert [s.result for s in done] == ["looking up 42\n\norder 42 is shipped"]
            assert streamed_text(later) == ("The helper: looking up 42\n\norder 42 is shipped")

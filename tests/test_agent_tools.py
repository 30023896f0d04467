"""Another agent as a tool: calling it runs that agent's own turn (its instructions, model
and tools) to completion and returns its final text, over a real socket; the client sees
the call's lifecycle with progress, not the other agent's text as the answer."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.agent.file import load_agent
from gateway.errors import ConfigError
from gateway.wire.v1 import TextDelta, ToolStatus, UserMessage
from tests.data.tools import runs
from tests.support import Gateway, say, serving, session


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def main_agent(tmp_path: Path) -> Path:
    write(
        tmp_path / "helper_scenario.toml",
        """
        pace = 0
        fallback = "I only do sums."
        [[rules]]
        match = 'add (\\d+) and (\\d+)'
        say = "Adding."
        calls = [{ tool = "add", args = { a = "{1|int}", b = "{2|int}" } }]
        [[results]]
        tool = "add"
        say = "It is {output.total}."
        """,
    )
    write(
        tmp_path / "helper.toml",
        """
        name = "helper"
        instructions = "You do sums."
        [model]
        provider = "scripted"
        scenario = "helper_scenario.toml"
        [[server_tools]]
        ref = "tests.data.tools:add"
        """,
    )
    write(
        tmp_path / "main_scenario.toml",
        """
        pace = 0
        fallback = "?"
        [[rules]]
        match = 'ask the helper (.*)'
        calls = [{ tool = "helper", args = { request = "{1}" } }]
        [[results]]
        tool = "helper"
        say = "The helper says: {output.text}"
        on_error = "The helper failed: {error}"
        """,
    )
    return write(
        tmp_path / "main.toml",
        """
        name = "main"
        [model]
        provider = "scripted"
        scenario = "main_scenario.toml"
        [[agent_tools]]
        name = "helper"
        file = "helper.toml"
        description = "Ask the helper agent to do a sum."
        """,
    )


@pytest.fixture
async def gateway(main_agent: Path) -> AsyncIterator[Gateway]:
    async with serving(agent=str(main_agent)) as running:
        yield running


async def test_the_other_agent_runs_its_own_turn_with_its_own_tool(gateway: Gateway):
    before = runs["add"]
    async with session(gateway.url) as (conn, created):
        assert [(t.name, t.kind) for t in created.tools] == [("helper", "server")]
        events = await say(conn, "ask the helper add 2 and 40")
    statuses = [e for e in events if isinstance(e, ToolStatus)]
    assert [s.status for s in statuses] == [
        "running",
        "progress",
        "progress",
        "progress",
        "completed",
    ]
    assert [s.progress for s in statuses[1:4]] == [
        {"agent": "helper", "step": 1},
        {"agent": "helper", "step": 1, "tool": "add"},
        {"agent": "helper", "step": 2},
    ]
    assert statuses[-1].result == {"text": "It is 42."}
    # Its text is the call's result, not the answer: the client hears the main agent.
    assert "".join(e.delta for e in events if isinstance(e, TextDelta)) == (
        "The helper says: It is 42."
    )
    assert runs["add"] == before + 1  # its own tool ran, once


async def test_the_http_console_lists_and_runs_an_agent_tool(gateway: Gateway):
    base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
    async with httpx.AsyncClient(base_url=base) as http:
        (listed,) = (await http.get("/v1/tools")).json()["tools"]
        ran = (await http.post("/v1/tools/helper/test", json={"request": "what?"})).json()
    assert (listed["name"], listed["backend"]) == ("helper", "agent:helper")
    assert ran["output"] == {"text": "I only do sums."}
    assert ran["progress"] == [{"agent": "helper", "step": 1}]


async def test_agents_that_name_each_other_are_a_startup_error(tmp_path: Path):
    for me, other in (("a", "b"), ("b", "a")):
        write(tmp_path / f"{me}_scenario.toml", 'fallback = "x"\n')
        write(
            tmp_path / f"{me}.toml",
            f"""
            name = "{me}"
            [model]
            provider = "scripted"
            scenario = "{me}_scenario.toml"
            [[agent_tools]]
            name = "ask_{other}"
            file = "{other}.toml"
            description = "Ask {other}."
            """,
        )
    agent = load_agent(tmp_path / "a.toml")
    with pytest.raises(ConfigError) as raised:
        await agent.start()
    message = str(raised.value)
    assert message.startswith("agent:ask_b: ")
    assert "agent:ask_a: a.toml is already being loaded (a cycle)" in message


async def test_a_message_to_the_main_agent_is_not_seen_by_the_other(gateway: Gateway):
    async with session(gateway.url) as (conn, _):
        await say(conn, "ask the helper add 1 and 1")
        await conn.send(UserMessage(text="ask the helper add 2 and 2"))
        events = await conn.recv_until(
            lambda e: isinstance(e, ToolStatus) and e.status == "completed"
        )
    assert events[-1].result == {"text": "It is 4."}  # type: ignore[union-attr]

"""Tools from everywhere, end to end: one agent whose tools run in a real MCP server (over
stdio, started by the gateway) and in a real HTTP API described by its own OpenAPI document.
The scripted model calls them in a conversation over a real socket; agent builders list and
test them over HTTP (``/v1/tools``) and from the command line (``gateway tools``)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.__main__ import _parser
from gateway.agent.cli import run_tools_command
from gateway.tools.mcp.backend import McpTools
from gateway.wire.v1 import ResponseDone, ToolStatus
from tests.mcp_support import SERVER_SCRIPT
from tests.openapi_service import ShopState, openapi_service
from tests.support import Gateway, say, serving, session, streamed_text

SCENARIO = """
pace = 0
fallback = "Ask me to add, count or look up an order."

[[rules]]
match = 'add (?P<a>\\d+) and (?P<b>\\d+)'
calls = [{ tool = "calc_add", args = { a = "{a|int}", b = "{b|int}" } }]

[[rules]]
match = 'who serves'
calls = [{ tool = "whoami" }]

[[rules]]
match = 'count to (?P<n>\\d+)'
calls = [{ tool = "count_slowly", args = { n = "{n|int}" } }]

[[rules]]
match = 'order (?P<id>o-\\d+)'
calls = [{ tool = "get_order", args = { order_id = "{id}" } }]

[[results]]
tool = "calc_add"
say = "The sum is {output.sum}."
on_error = "No sum: {error}"

[[results]]
tool = "whoami"
say = "Process {output.pid}."

[[results]]
tool = "count_slowly"
when = "pending"
say = "Counting, tell you when done."

[[completions]]
tool = "count_slowly"
say = "Done counting."

[[results]]
tool = "get_order"
say = "Order {output.id} is {output.status}."
on_error = "No luck: {error}"
"""


@dataclass
class Toolsmith:
    agent: Path
    shop: ShopState


@pytest.fixture
async def toolsmith(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Toolsmith]:
    monkeypatch.setenv("SHOP_TOKEN", "letmein")
    async with openapi_service() as (url, shop):
        (tmp_path / "scenario.toml").write_text(SCENARIO)
        agent = tmp_path / "agent.toml"
        agent.write_text(
            textwrap.dedent(
                f"""
                name = "toolsmith"
                [model]
                provider = "scripted"
                scenario = "scenario.toml"

                [[server_tools]]
                ref = "tests.data.tools:add"    # the MCP server's `add` becomes `calc_add`

                [[mcp_servers]]
                name = "calc"
                command = [{json.dumps(sys.executable)}, {json.dumps(str(SERVER_SCRIPT))}, "stdio"]
                tools = ["add", "count_slowly", "fail", "whoami"]
                tool_options.count_slowly = {{ execution = "async" }}

                [[openapi]]
                name = "shop"
                document = "{url}/openapi.json"
                operations = ["getOrder", "createOrder", "whoAmI"]
                headers = {{ Authorization = "Bearer ${{SHOP_TOKEN}}" }}
                """
            )
        )
        yield Toolsmith(agent, shop)


@pytest.fixture
async def gateway(toolsmith: Toolsmith) -> AsyncIterator[Gateway]:
    async with serving(agent=str(toolsmith.agent)) as running:
        yield running


def http_base(gateway: Gateway) -> str:
    return gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")


def lifecycle(events: list[object]) -> list[tuple[str, str]]:
    return [(e.tool, e.status) for e in events if isinstance(e, ToolStatus)]


async def test_the_model_calls_an_mcp_tool_and_an_openapi_tool_and_the_client_sees_them(
    gateway: Gateway, toolsmith: Toolsmith
):
    async with session(gateway.url) as (conn, created):
        offered = {t.name: t.execution for t in created.tools}
        assert offered == {
            "add": "sync",
            "calc_add": "sync",
            "count_slowly": "async",
            "whoami": "sync",
            "fail": "sync",
            "get_order": "sync",
            "create_order": "sync",
            "who_am_i": "sync",
        }

        events = await say(conn, "please add 2 and 40")
        assert lifecycle(events) == [("calc_add", "running"), ("calc_add", "completed")]
        completed = [e for e in events if isinstance(e, ToolStatus)][-1]
        assert completed.result == {"sum": 42}
        assert streamed_text(events) == "The sum is 42.0."  # the server adds floats

        events = await say(conn, "where is order o-100")
        assert lifecycle(events) == [("get_order", "running"), ("get_order", "completed")]
        assert streamed_text(events) == "Order o-100 is open."

        events = await say(conn, "and order o-999")  # the API answers 404
        assert lifecycle(events) == [("get_order", "running"), ("get_order", "failed")]
        failed = [e for e in events if isinstance(e, ToolStatus)][-1]
        assert failed.error is not None
        assert failed.error.startswith("HTTP 404 Not Found:")
        assert streamed_text(events).startswith("No luck: HTTP 404 Not Found:")

        # An async MCP tool: pending at once, its progress, then its completion.
        events = await say(conn, "count to 3")
        assert lifecycle(events) == [("count_slowly", "pending")]
        assert streamed_text(events) == "Counting, tell you when done."
        later = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        progress = [e.progress for e in later if isinstance(e, ToolStatus)][:-1]
        assert progress == [
            {"progress": step, "total": 3, "message": f"step {step}"} for step in (1, 2, 3)
        ]
        assert lifecycle(later)[-1] == ("count_slowly", "completed")
        assert streamed_text(later) == "Done counting."


async def test_the_http_console_lists_and_runs_each_kind_of_tool(gateway: Gateway):
    async with httpx.AsyncClient(base_url=http_base(gateway)) as http:
        listed = {t["name"]: t for t in (await http.get("/v1/tools")).json()["tools"]}
        assert listed["add"]["backend"] == "python"
        assert listed["calc_add"]["backend"] == "mcp:calc"
        assert listed["get_order"]["backend"] == "openapi:shop"
        assert listed["get_order"]["read_only"] is True
        assert listed["create_order"]["read_only"] is False

        ran = (await http.post("/v1/tools/add/test", json={"a": 1, "b": 2})).json()
        assert ran["output"] == {"total": 3}
        ran = (await http.post("/v1/tools/calc_add/test", json={"a": 1, "b": 2})).json()
        assert ran["output"] == {"sum": 3}
        ran = (await http.post("/v1/tools/count_slowly/test", json={"n": 2})).json()
        assert ran["output"] == "counted to 2"
        assert [p["progress"] for p in ran["progress"]] == [1, 2]
        ran = (await http.post("/v1/tools/fail/test", json={"message": "nope"})).json()
        assert ran["error"].endswith("nope")  # the isError result's text
        ran = (await http.post("/v1/tools/who_am_i/test", json={})).json()
        assert ran["output"] == {"user": "agent"}  # the header came from SHOP_TOKEN
        ran = (await http.post("/v1/tools/get_order/test", json={"order_id": "o-1"})).json()
        assert ran["error"].startswith("HTTP 404 Not Found:")

        invalid = (("add", {"a": 1}), ("calc_add", {"a": "two"}), ("get_order", {"id": "o-1"}))
        for name, body in invalid:
            refused = await http.post(f"/v1/tools/{name}/test", json=body)
            assert refused.status_code == 422
            assert "invalid input" in refused.json()["error"]


async def test_an_mcp_server_killed_mid_conversation_is_started_again(gateway: Gateway):
    async with session(gateway.url) as (conn, _):
        events = await say(conn, "who serves you?")
        first = [e for e in events if isinstance(e, ToolStatus)][-1].result
        assert isinstance(first, dict)
        backend = gateway.runtime.agent.toolbox.backend_of("calc_add")
        assert isinstance(backend, McpTools)
        connection = backend._conn
        assert connection is not None
        os.kill(first["pid"], signal.SIGKILL)
        # Once the gateway has seen the server go (a call sent before that fails, not
        # retried: test_mcp_tools.py), the next call waits for it to be started again.
        async with asyncio.timeout(10):
            await connection.lost.wait()
        events = await say(conn, "please add 1 and 2")
        assert lifecycle(events) == [("calc_add", "running"), ("calc_add", "completed")]
        assert streamed_text(events) == "The sum is 3.0."
        events = await say(conn, "who serves you now?")
        second = [e for e in events if isinstance(e, ToolStatus)][-1].result
        assert isinstance(second, dict)
        assert second["pid"] != first["pid"]


async def gateway_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow  # a CLI process per kind of tool: about 17 s
async def test_the_cli_lists_and_tests_each_kind_of_tool(toolsmith: Toolsmith):
    agent = str(toolsmith.agent)
    code, out, _ = await gateway_cli("tools", "list", "--agent", agent)
    assert code == 0
    rows = {line.split()[0]: line.split()[1:4] for line in out.splitlines()[1:]}
    assert rows["add"] == ["server", "python", "sync"]
    assert rows["calc_add"] == ["server", "mcp:calc", "sync"]
    assert rows["count_slowly"] == ["server", "mcp:calc", "async"]
    assert rows["get_order"] == ["server", "openapi:shop", "sync"]
    assert "order_id: string" in out

    code, out, _ = await gateway_cli(
        "tools", "test", "calc_add", "--input", '{"a": 1, "b": 2}', "--agent", agent
    )
    assert code == 0
    assert json.loads(out)["output"] == {"sum": 3}

    parsed = _parser().parse_args(["tools", "list", "--agent", agent, "--json"])
    out_buffer = io.StringIO()
    assert await run_tools_command(parsed, out_buffer) == 0
    listed = {row["name"]: row for row in json.loads(out_buffer.getvalue())}
    assert listed["create_order"]["backend"] == "openapi:shop"
    assert listed["create_order"]["input"] == "body: object"

    cases = [
        (["add", "--input", '{"a": 20, "b": 22}'], 0, "output", {"total": 42}),
        (["calc_add", "--input", '{"a": 20, "b": 22}'], 0, "output", {"sum": 42}),
        (["get_order", "--input", '{"order_id": "o-100"}'], 0, "output", "o-100"),
        (["get_order", "--input", '{"order_id": "o-9"}'], 1, "error", "HTTP 404 Not Found"),
        (["fail", "--input", '{"message": "broken"}'], 1, "error", "broken"),
        (["add", "--input", '{"a": "x"}'], 2, "error", "invalid input"),
        (["calc_add", "--input", '{"b": 1}'], 2, "error", "invalid input"),
        (["get_order", "--input", "{nope"], 2, "error", "not JSON"),
        (["teleport"], 2, "error", "no tool 'teleport'"),
    ]
    for args, status, key, expected in cases:
        # In this process (each run in a new one costs ~3 s of imports): the same code.
        out_buffer = io.StringIO()
        parsed = _parser().parse_args(["tools", "test", *args, "--agent", agent, "--json"])
        assert await run_tools_command(parsed, out_buffer) == status, args
        answer = json.loads(out_buffer.getvalue())
        if isinstance(expected, dict):
            assert answer[key] == expected
        elif key == "output":
            assert answer[key]["id"] == expected
        else:
            assert expected in answer[key]


async def test_an_mcp_server_that_cannot_start_stops_the_gateway_with_a_clear_error(
    tmp_path: Path,
):
    agent = tmp_path / "agent.toml"
    (tmp_path / "scenario.toml").write_text('fallback = "hi"\n')
    agent.write_text(
        'name = "broken"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
        '[[mcp_servers]]\nname = "ghost"\ncommand = ["no-such-mcp-server-xyz"]\n'
    )
    code, _, err = await gateway_cli("tools", "list", "--agent", str(agent))
    assert code == 2
    assert "configuration error" in err
    assert "mcp:ghost" in err
    code, _, err = await gateway_cli("serve", "--port", "0", "--no-auth", "--agent", str(agent))
    assert code == 2
    assert "mcp:ghost" in err

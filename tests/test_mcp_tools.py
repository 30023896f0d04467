"""``McpTools`` against a real MCP server (``tests/mcp_server.py``), over stdio and HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from gateway.errors import ConfigError, ToolError
from gateway.tools.backend import McpServerEntry, Toolbox, ToolOptions
from gateway.tools.mcp.backend import McpTools
from gateway.tools.mcp.result import definitions_of, tool_result
from tests.mcp_support import (
    SERVER_SCRIPT,
    HttpMcpServer,
    logged_calls,
    running_http_server,
    stdio_entry,
    wait_for_logged,
)

in_module_loop = pytest.mark.asyncio(loop_scope="module")
"""For the tests of the ``shared`` backends, which live in the module's event loop."""


@dataclass
class Shared:
    """A backend started once for the tests that neither kill its server nor close it."""

    backend: McpTools
    transport: str
    call_log: Path
    base_dir: Path


@dataclass
class Progress:
    """A ``ReportProgress`` that keeps every report, and tells when the first came."""

    reports: list[Any] = field(default_factory=list)
    first: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, payload: Any) -> None:
        self.reports.append(payload)
        self.first.set()


@pytest.fixture(scope="module")
def shared_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One HTTP server for the tests that do not kill it (starting one takes a second)."""
    call_log = tmp_path_factory.mktemp("mcp_http") / "calls.log"
    process = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), "http"],
        stdout=subprocess.PIPE,
        env={**os.environ, "MCP_TEST_CALL_LOG": str(call_log)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # the server prints it once it listens, or exits
    try:
        assert line.startswith(b"PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp", call_log
    finally:
        process.terminate()
        process.communicate(timeout=10)


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=["stdio", "http"])
async def shared(
    request: pytest.FixtureRequest,
    shared_http: tuple[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Shared]:
    """``McpTools`` over stdio or over HTTP, started (starting a stdio server takes a second).

    Its settings use what the agent file may: ``${VAR}``, ``cwd``, ``timeout``.
    """
    base_dir = tmp_path_factory.mktemp("agent")
    (base_dir / "work").mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MCP_TEST_TAG_SOURCE", "from-the-gateway")
        if request.param == "stdio":
            call_log = base_dir / "calls.log"
            entry = stdio_entry(
                call_log=call_log,
                env={"MCP_TEST_TAG": "${MCP_TEST_TAG_SOURCE}", "MCP_TEST_PAGE_SIZE": "3"},
                cwd="work",
                timeout=7.0,
            )
        else:
            url, call_log = shared_http
            entry = McpServerEntry(
                name="demo",
                url=url,
                headers={"X-Test-Tag": "${MCP_TEST_TAG_SOURCE}"},
                timeout=7.0,
            )
        backend = McpTools(entry, base_dir)  # ${VAR} are expanded here
    async with started(backend) as backend:
        yield Shared(backend, request.param, call_log, base_dir)


@asynccontextmanager
async def started(tools: McpTools) -> AsyncIterator[McpTools]:
    try:
        async with asyncio.timeout(30):
            await tools.start()
        yield tools
    finally:
        await tools.aclose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tag() -> str:
    return uuid.uuid4().hex[:8]


def ignore(_: Any) -> None:
    pass


@in_module_loop
async def test_lists_and_calls_tools(shared: Shared) -> None:
    backend = shared.backend
    assert backend.name == "mcp:demo"
    assert backend.kind == "mcp"
    assert backend.prefix == "demo"
    definitions = {d.name: d for d in backend.definitions()}
    # Over stdio the server lists them 3 at a time: every page was read.
    assert {
        "add",
        "echo",
        "count_slowly",
        "fail",
        "whoami",
        "block",
        "peek",
        "add_tool",
        "picture",
        "protocol_error",
    } <= set(definitions)
    add = definitions["add"]
    assert add.description == "Add two numbers."
    assert add.kind == "server"
    assert add.input_schema["type"] == "object"
    assert set(add.input_schema["properties"]) == {"a", "b"}
    assert add.input_schema["required"] == ["a", "b"]
    assert add.output_schema is not None
    assert add.output_schema["properties"]["sum"]["type"] == "number"
    assert add.timeout == 7.0
    assert add.read_only is None
    assert definitions["echo"].output_schema is None
    assert definitions["peek"].read_only is True
    assert definitions["peek"].display_name == "Peek"

    assert await backend.call("add", {"a": 1, "b": 2.5}, ignore) == {"sum": 3.5}
    assert await backend.call("echo", {"text": "hi"}, ignore) == "hi"
    assert await backend.call("picture", {}, ignore) == [
        {"type": "text", "text": "a red dot"},
        {"type": "image", "mime_type": "image/png", "size": 8},
    ]
    with pytest.raises(ToolError, match="boom"):
        await backend.call("fail", {"message": "boom"}, ignore)
    with pytest.raises(ToolError, match="MCP error -32602: no such thing"):
        await backend.call("protocol_error", {}, ignore)

    progress = Progress()
    assert await backend.call("count_slowly", {"n": 4}, progress) == "counted to 4"
    assert progress.reports == [
        {"progress": step, "total": 4, "message": f"step {step}"} for step in range(1, 5)
    ]

    identity = await backend.call("whoami", {}, ignore)
    assert identity["tag"] == "from-the-gateway"  # env (stdio) or header (HTTP)
    if shared.transport == "stdio":
        assert Path(identity["cwd"]) == shared.base_dir / "work"


async def test_tools_and_tool_options_from_the_agent_file(
    shared_http: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = shared_http
    entry = McpServerEntry(
        name="demo",
        url=url,
        tools=["add", "echo"],
        tool_options={"echo": ToolOptions(timeout=3.0, display_name="Say it", execution="async")},
    )
    async with started(McpTools(entry, tmp_path)) as backend:
        definitions = {d.name: d for d in backend.definitions()}
        assert set(definitions) == {"add", "echo"}
        assert definitions["echo"].timeout == 3.0
        assert definitions["echo"].display_name == "Say it"
        assert definitions["echo"].execution == "async"

    for fields in ({"tools": ["add", "nope"]}, {"tool_options": {"nope": ToolOptions()}}):
        backend = McpTools(McpServerEntry(name="demo", url=url, **fields), tmp_path)
        with pytest.raises(ConfigError, match=r"mcp:demo.*'nope'"):
            await backend.start()
        await backend.aclose()


def test_settings_are_checked_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"MCP server 'demo'.*MCP_TEST_NOT_SET"):
        McpTools(stdio_entry(env={"X": "a${MCP_TEST_NOT_SET}"}), tmp_path)
    with pytest.raises(ConfigError, match=r"MCP server 'demo'.*MCP_TEST_NOT_SET"):
        McpTools(
            McpServerEntry(
                name="demo", url="http://x/mcp", headers={"A": "Bearer ${MCP_TEST_NOT_SET}"}
            ),
            tmp_path,
        )
    with pytest.raises(ConfigError, match=r"MCP server 'demo'.*either command"):
        McpTools(McpServerEntry(name="demo"), tmp_path)
    with pytest.raises(ConfigError, match=r"MCP server 'demo'.*either command"):
        McpTools(McpServerEntry(name="demo", command=["x"], url="http://x/mcp"), tmp_path)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"command": ["/nonexistent/mcp-server"]}, "command not found: /nonexistent/mcp-server"),
        ({"command": [sys.executable, "-c", "raise SystemExit(3)"]}, "exited"),
        (
            {
                "command": [sys.executable, "-c", "import sys; sys.stdin.read()"],
                "connect_timeout": 0.3,
            },
            r"no answer within connect_timeout \(0.3 s\)",
        ),
        ({"url": "<a port nobody listens on>"}, "connection refused"),
    ],
    ids=["command-not-found", "exits", "silent", "refused"],
)
async def test_unreachable_at_startup_is_a_config_error(
    fields: dict[str, Any], reason: str, tmp_path: Path
) -> None:
    with socket.socket() as bound:  # bound, not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        if "url" in fields:
            fields = {**fields, "url": f"http://127.0.0.1:{bound.getsockname()[1]}/mcp"}
        backend = McpTools(McpServerEntry(name="files", **fields), tmp_path)
        with pytest.raises(ConfigError, match=f"MCP server 'files': .*{reason}"):
            await backend.start()
        await backend.aclose()
    assert not backend.definitions()
    with pytest.raises(ToolError, match="offers no tool 'echo'"):
        await backend.call("echo", {"text": "x"}, ignore)


async def test_optional_server_joins_once_it_is_up_and_fails_calls_when_down(
    tmp_path: Path,
) -> None:
    call_log = tmp_path / "calls.log"
    port = free_port()
    entry = McpServerEntry(
        name="late", url=f"http://127.0.0.1:{port}/mcp", optional=True, connect_timeout=1.0
    )
    backend = McpTools(entry, tmp_path)
    toolbox = Toolbox([backend])
    joined = asyncio.Event()
    backend.on_change(joined.set)  # after the toolbox's own listener
    try:
        await toolbox.start()  # a warning, not an error
        assert len(toolbox.registry) == 0
        with pytest.raises(ToolError, match="no server tool 'echo'"):
            await toolbox.call("echo", {"text": "x"}, ignore)
        http = HttpMcpServer(call_log=call_log)
        http.port = port
        await http.start()
        try:
            async with asyncio.timeout(20):
                await joined.wait()
            assert toolbox.registry.get("echo") is not None
            assert await toolbox.call("echo", {"text": "late"}, ignore) == "late"
        finally:
            await http.kill()
        # The first call finds it gone; the next waits for a reconnection, in vain.
        with pytest.raises(ToolError, match="connection refused; the call was not retried"):
            await toolbox.call("echo", {"text": "down"}, ignore)
        with pytest.raises(
            ToolError,
            match=r"not connected \(.*connection refused\), still after 1 s; the call was not"
            " made",
        ):
            await toolbox.call("echo", {"text": "down"}, ignore)
    finally:
        await toolbox.aclose()
    assert logged_calls(call_log) == ["echo late"]


@in_module_loop
async def test_list_changed_updates_the_tools(shared: Shared) -> None:
    backend = shared.backend
    toolbox = Toolbox([backend])  # not started (the backend is): only to see it refresh
    changed = asyncio.Event()
    backend.on_change(changed.set)  # after the toolbox's own listener
    new_tool = f"greet_{tag()}"
    assert toolbox.registry.get(new_tool) is None
    assert await toolbox.call("add_tool", {"name": new_tool}, ignore) == f"added {new_tool}"
    async with asyncio.timeout(10):
        await changed.wait()
    assert new_tool in {d.name for d in backend.definitions()}
    assert toolbox.registry.get(new_tool) is not None
    assert await toolbox.call(new_tool, {"who": "bob"}, ignore) == "hello bob"


@in_module_loop
async def test_cancelled_call_is_cancelled_on_the_server(shared: Shared) -> None:
    name = tag()
    progress = Progress()
    call = asyncio.create_task(shared.backend.call("block", {"tag": name}, progress))
    async with asyncio.timeout(10):
        await progress.first.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The SDK sent notifications/cancelled: the server's handler was cancelled.
    await wait_for_logged(shared.call_log, f"block {name} cancelled")
    echoed = await shared.backend.call("echo", {"text": f"after {name}"}, ignore)
    assert echoed == f"after {name}"
    assert logged_calls(shared.call_log).count(f"block {name}") == 1


async def test_stdio_server_killed_during_and_between_calls(tmp_path: Path) -> None:
    call_log = tmp_path / "calls.log"
    async with started(McpTools(stdio_entry(call_log=call_log), tmp_path)) as backend:
        first_pid = (await backend.call("whoami", {}, ignore))["pid"]
        progress = Progress()
        call = asyncio.create_task(backend.call("block", {"tag": "k1"}, progress))
        async with asyncio.timeout(10):
            await progress.first.wait()
        os.kill(first_pid, signal.SIGKILL)
        with pytest.raises(ToolError, match=r"stopped during the call.*not retried"):
            await call
        # The next call waits for the supervisor to start the server again.
        assert await backend.call("echo", {"text": "after-1"}, ignore) == "after-1"
        second_pid = (await backend.call("whoami", {}, ignore))["pid"]
        assert second_pid != first_pid

        connection = backend._conn
        assert connection is not None
        os.kill(second_pid, signal.SIGKILL)
        async with asyncio.timeout(10):  # else the call could race the death
            await connection.lost.wait()
        assert await backend.call("echo", {"text": "after-2"}, ignore) == "after-2"
        assert (await backend.call("whoami", {}, ignore))["pid"] not in (first_pid, second_pid)
    calls = logged_calls(call_log)
    assert [c for c in calls if not c.startswith("whoami")] == [
        "block k1",
        "echo after-1",
        "echo after-2",
    ]


async def test_http_server_killed_during_and_between_calls(tmp_path: Path) -> None:
    call_log = tmp_path / "calls.log"
    async with running_http_server(call_log=call_log) as http:
        async with started(McpTools(http.entry(), tmp_path)) as backend:
            pid = (await backend.call("whoami", {}, ignore))["pid"]
            progress = Progress()
            call = asyncio.create_task(backend.call("block", {"tag": "k1"}, progress))
            async with asyncio.timeout(10):
                await progress.first.wait()
            os.kill(pid, signal.SIGKILL)
            await http.reaped()
            with pytest.raises(ToolError, match=r"stopped during the call.*not retried"):
                await call
            await http.start()  # same port
            assert await backend.call("echo", {"text": "after-1"}, ignore) == "after-1"

            pid = (await backend.call("whoami", {}, ignore))["pid"]
            os.kill(pid, signal.SIGKILL)
            await http.reaped()
            await http.start()
            # Whether the gateway noticed already (its listening stream broke) or learns it
            # from this call (the new server does not know the session), nothing runs twice.
            second: Any
            try:
                second = await backend.call("echo", {"text": "after-2"}, ignore)
            except ToolError as exc:
                second = exc
            if isinstance(second, ToolError):
                assert "not retried" in str(second)
            else:
                assert second == "after-2"
            assert await backend.call("echo", {"text": "after-3"}, ignore) == "after-3"
    calls = [c for c in logged_calls(call_log) if not c.startswith("whoami")]
    ran_second = [] if isinstance(second, ToolError) else ["echo after-2"]
    assert calls == ["block k1", "echo after-1", *ran_second, "echo after-3"]


async def test_clashing_tool_names_are_prefixed(
    shared_http: tuple[str, Path], tmp_path: Path
) -> None:
    url, call_log = shared_http  # two backends for one server: every name clashes
    toolbox = Toolbox(
        [
            McpTools(McpServerEntry(name="a", url=url), tmp_path),
            McpTools(McpServerEntry(name="b", url=url), tmp_path),
        ]
    )
    try:
        await toolbox.start()
        names = {row.definition.name: row.backend for row in toolbox.rows()}
        assert names["a_echo"] == "mcp:a"
        assert names["b_echo"] == "mcp:b"
        assert "echo" not in names
        text = tag()
        assert await toolbox.call("a_echo", {"text": f"a {text}"}, ignore) == f"a {text}"
        assert await toolbox.call("b_echo", {"text": f"b {text}"}, ignore) == f"b {text}"
    finally:
        await toolbox.aclose()
    calls = logged_calls(call_log)
    assert calls.count(f"echo a {text}") == 1
    assert calls.count(f"echo b {text}") == 1


def test_unusable_tools_are_left_out() -> None:
    listed = [
        types.Tool(name="getOrder", input_schema={"properties": {}}),  # no type: object added
        types.Tool(name="scalar", description="Takes a string.", input_schema={"type": "string"}),
        types.Tool(name="get_order", description="Twin.", input_schema={"type": "object"}),
        types.Tool(name="titled", title="Nice title", input_schema={"type": "object"}),
    ]
    with capture_logs() as logs:
        definitions, originals, problem = definitions_of(listed, stdio_entry("odd"), "mcp:odd")
    assert problem is None
    left_out = [e for e in logs if e["event"] == "mcp_tool_left_out"]
    assert [(e["log_level"], e["tool"]) for e in left_out] == [
        ("warning", "scalar"),
        ("warning", "get_order"),
    ]
    assert [d.name for d in definitions] == ["get_order", "titled"]
    assert originals == {"get_order": "getOrder", "titled": "titled"}
    assert definitions[0].input_schema == {"properties": {}, "type": "object"}
    assert definitions[0].description == "The 'getOrder' tool of the MCP server 'odd'."
    assert definitions[1].description == "Nice title"
    assert definitions[1].display_name == "Nice title"


def test_results_as_the_model_sees_them() -> None:
    blob = types.BlobResourceContents(uri="file:///a.bin", mime_type="application/pdf", blob="AAAA")
    result = types.CallToolResult(
        content=[
            types.AudioContent(data="AAECAw==", mime_type="audio/wav"),
            types.ResourceLink(uri="file:///b.txt", name="b.txt"),
            types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///c", text="c")),
            types.EmbeddedResource(resource=blob),
        ]
    )
    assert tool_result(result) == [
        {"type": "audio", "mime_type": "audio/wav", "size": 4},
        {"type": "resource_link", "uri": "file:///b.txt", "name": "b.txt"},
        {"type": "resource", "uri": "file:///c", "text": "c"},
        {"type": "resource", "uri": "file:///a.bin", "mime_type": "application/pdf", "size": 3},
    ]
    assert tool_result(types.CallToolResult(content=[], structured_content={"n": 1})) == {"n": 1}
    failed = types.CallToolResult(
        content=[types.ImageContent(data="", mime_type="x")], is_error=True
    )
    with pytest.raises(ToolError, match="the tool failed without saying why"):
        tool_result(failed)

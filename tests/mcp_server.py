"""A real MCP server for tests, built with the ``mcp`` SDK's ``MCPServer``.

Run it as ``python tests/mcp_server.py stdio`` (the gateway starts it) or as
``python tests/mcp_server.py http [--port N]`` (streamable HTTP on 127.0.0.1; port 0, the
default, picks a free one). Over HTTP it prints ``PORT <n>`` on stdout once its socket
listens, so a test waits on that line rather than guessing a port.

Its tools: ``add`` (structured output), ``echo``, ``count_slowly`` (progress at each
step), ``fail`` (an ``isError`` result), ``protocol_error`` (a JSON-RPC error), ``whoami``
(pid, working directory, test tag), ``block`` (reports progress once, then waits to be
cancelled), ``peek`` (read-only, titled), ``add_tool`` (offers a new tool and sends
``notifications/tools/list_changed``) and ``picture`` (text and an image).

Environment: each call appends a line naming it (``echo hi``, ``block t1``, ``block t1
cancelled``...) to the file ``MCP_TEST_CALL_LOG`` names, at once: the file outlives the
process, so a test can tell whether a call ran, and how many times, across a kill and a
restart. ``MCP_TEST_PAGE_SIZE`` makes ``tools/list`` answer in pages. ``MCP_TEST_TAG`` (or,
over HTTP, the ``X-Test-Tag`` header) is what ``whoami`` reports as its tag.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel


class _PagedServer(MCPServer):
    """Lists its tools ``MCP_TEST_PAGE_SIZE`` at a time (when set), so clients must follow
    ``nextCursor``."""

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await self.list_tools()
        size = int(os.environ.get("MCP_TEST_PAGE_SIZE", "0"))
        if not size:
            return types.ListToolsResult(tools=tools)
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + size
        cursor = str(end) if end < len(tools) else None
        return types.ListToolsResult(tools=tools[start:end], next_cursor=cursor)


server = _PagedServer("test-server", instructions="Tools for the gateway's MCP tests.")


def _log_call(entry: str) -> None:
    path = os.environ.get("MCP_TEST_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{entry}\n")


class Sum(BaseModel):
    sum: float


class Identity(BaseModel):
    pid: int
    cwd: str
    tag: str | None
    """``MCP_TEST_TAG`` from the environment (stdio) or the ``X-Test-Tag`` header (HTTP)."""


@server.tool(description="Add two numbers.")
def add(a: float, b: float) -> Sum:
    _log_call("add")
    return Sum(sum=a + b)


@server.tool(description="Say the text back.", structured_output=False)
def echo(text: str) -> str:
    _log_call(f"echo {text}")
    return text


@server.tool(description="Count to n, reporting progress at each step.", structured_output=False)
async def count_slowly(n: int, ctx: Context) -> str:
    _log_call("count_slowly")
    for step in range(1, n + 1):
        await ctx.report_progress(step, n, f"step {step}")
        await anyio.lowlevel.checkpoint()
    return f"counted to {n}"


@server.tool(
    description="Fail with the given message (an isError result).", structured_output=False
)
def fail(message: str) -> str:
    _log_call("fail")
    raise ToolError(message)


@server.tool(description="Tell the server's pid, working directory and test tag.")
def whoami(ctx: Context) -> Identity:
    _log_call("whoami")
    tag = os.environ.get("MCP_TEST_TAG")
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    if headers is not None:
        tag = headers.get("x-test-tag")
    return Identity(pid=os.getpid(), cwd=os.getcwd(), tag=tag)


@server.tool(description="Answer with a JSON-RPC error, not a tool result.")
def protocol_error() -> str:
    _log_call("protocol_error")
    raise MCPError(types.INVALID_PARAMS, "no such thing")


@server.tool(
    description="Report progress once, then wait until the call is cancelled (`tag` names it).",
    structured_output=False,
)
async def block(tag: str, ctx: Context) -> str:
    _log_call(f"block {tag}")
    await ctx.report_progress(0, None, "started")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        _log_call(f"block {tag} cancelled")
        raise
    return "unreachable"


@server.tool(
    title="Peek",
    description="Look without touching.",
    annotations=types.ToolAnnotations(read_only_hint=True),
    structured_output=False,
)
def peek() -> str:
    _log_call("peek")
    return "nothing changed"


@server.tool(description="Offer a new tool called `name` and announce it.", structured_output=False)
async def add_tool(name: str, ctx: Context) -> str:
    _log_call(f"add_tool {name}")

    def greet(who: str) -> str:
        _log_call(f"{name} {who}")
        return f"hello {who}"

    server.add_tool(greet, name=name, description="Greet someone.", structured_output=False)
    # On the call's own stream: an HTTP client may not have opened its standalone one yet.
    await ctx.session.send_notification(
        types.ToolListChangedNotification(), related_request_id=ctx.request_id
    )
    await ctx.notify_tools_changed()  # 2026-07-28 clients listen through subscriptions
    return f"added {name}"


@server.tool(description="Return an image and a text (mixed content).", structured_output=False)
def picture() -> list[Any]:
    _log_call("picture")
    return [
        types.TextContent(text="a red dot"),
        types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png"),
    ]


async def _serve_http(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    config = uvicorn.Config(
        server.streamable_http_app(),
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        anyio.run(_serve_http, args.port)


if __name__ == "__main__":
    main()

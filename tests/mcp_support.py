"""Start and stop the test MCP server (``tests/mcp_server.py``) for tests.

``stdio_mcp_server`` and ``http_mcp_server`` yield an ``McpServerEntry`` ready to give to
``gateway.tools.mcp.backend.McpTools`` (or to put in an agent): over stdio the gateway starts the
server itself; over HTTP the helper runs it in a process of its own on a free port.
``HttpMcpServer`` is the HTTP server's process, for tests that kill and restart it (on the
same port, so the gateway's entry stays right).

Set ``call_log`` to a file to learn which tools ran: the server appends one line per call
(``echo hi``, ``block t1``, ``block t1 cancelled``...); ``logged_calls`` reads it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.tools.backend import McpServerEntry

__all__ = [
    "SERVER_SCRIPT",
    "HttpMcpServer",
    "http_mcp_server",
    "logged_calls",
    "poll_until",
    "running_http_server",
    "stdio_entry",
    "stdio_mcp_server",
    "wait_for_logged",
]

SERVER_SCRIPT = Path(__file__).with_name("mcp_server.py")
_START_TIMEOUT = 30.0


def stdio_entry(
    name: str = "demo", *, call_log: Path | None = None, **fields: Any
) -> McpServerEntry:
    """An entry that has the gateway run the test server over stdio."""
    env = dict(fields.pop("env", {}))
    if call_log is not None:
        env["MCP_TEST_CALL_LOG"] = str(call_log)
    return McpServerEntry(
        name=name, command=[sys.executable, str(SERVER_SCRIPT), "stdio"], env=env, **fields
    )


@asynccontextmanager
async def stdio_mcp_server(
    name: str = "demo", *, call_log: Path | None = None, **fields: Any
) -> AsyncIterator[McpServerEntry]:
    """The test server over stdio: the gateway starts (and stops) its process."""
    yield stdio_entry(name, call_log=call_log, **fields)


class HttpMcpServer:
    """The test server over streamable HTTP on 127.0.0.1, in a process of its own.

    ``start`` picks a free port the first time and keeps it for restarts.
    """

    def __init__(self, *, call_log: Path | None = None) -> None:
        self.port = 0
        self._env = dict(os.environ)
        if call_log is not None:
            self._env["MCP_TEST_CALL_LOG"] = str(call_log)
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def entry(self, name: str = "demo", **fields: Any) -> McpServerEntry:
        """An entry for this server (its URL)."""
        return McpServerEntry(name=name, url=self.url, **fields)

    async def start(self) -> None:
        """Run the server and wait until it listens (it prints ``PORT <n>``)."""
        assert self._process is None, "already running"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SERVER_SCRIPT),
            "http",
            "--port",
            str(self.port),
            stdout=asyncio.subprocess.PIPE,
            env=self._env,
        )
        self._process = process
        assert process.stdout is not None
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                line = await process.stdout.readline()
            if not line.startswith(b"PORT "):
                raise RuntimeError(f"the test MCP server did not start: {line!r}")
        except BaseException:
            await self.stop()
            raise
        self.port = int(line.split()[1])

    async def reaped(self) -> None:
        """Wait for the process to end (a test killed it), and forget it."""
        process, self._process = self._process, None
        if process is not None:
            await process.communicate()  # reads stdout to its end: no pipe left open

    async def kill(self) -> None:
        """Kill the server at once, as a crash would."""
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signal.SIGKILL)
        await self.reaped()

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                process.kill()
        await self.reaped()

    async def restart(self) -> None:
        """Start it again on the same port (after ``kill`` or ``stop``)."""
        await self.stop()
        await self.start()


@asynccontextmanager
async def running_http_server(*, call_log: Path | None = None) -> AsyncIterator[HttpMcpServer]:
    """An ``HttpMcpServer``, started, and stopped at the end."""
    server = HttpMcpServer(call_log=call_log)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def http_mcp_server(
    name: str = "demo", *, call_log: Path | None = None, **fields: Any
) -> AsyncIterator[McpServerEntry]:
    """The test server over streamable HTTP; the entry points at it."""
    async with running_http_server(call_log=call_log) as server:
        yield server.entry(name, **fields)


def logged_calls(call_log: Path) -> list[str]:
    """The calls the server logged, in order."""
    try:
        return call_log.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


async def poll_until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds, for state nothing can be awaited on (a file another
    process writes, a backend's status). Wrap it in ``asyncio.timeout``."""
    while not condition():  # noqa: ASYNC110 - no event to wait on, see above
        await asyncio.sleep(0.01)


async def wait_for_logged(call_log: Path, line: str) -> None:
    """Wait (10 s at most) until the server has logged ``line``."""
    async with asyncio.timeout(10):
        await poll_until(lambda: line in logged_calls(call_log))

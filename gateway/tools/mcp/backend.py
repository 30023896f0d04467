"""The tools of one MCP server (``[[mcp_servers]]`` in an agent file), as a ``ToolBackend``.

The official ``mcp`` SDK speaks the protocol: a stdio server the gateway starts, or a
streamable-HTTP one. The SDK's transports and sessions are anyio context managers, which
must be entered and left in one task, so one supervisor task owns the connection: it
connects, lists the tools, lists them again when the server announces a change, and when
the server dies (its process exits, its HTTP endpoint goes away) connects again with
backoff. Calls come from other tasks and use whatever session is live.

The connection speaks the initialize handshake (protocol 2025-11-25 and earlier), which
every MCP server understands, 2026-era ones included; it carries
``notifications/tools/list_changed`` and ``notifications/cancelled`` as such.

A call is never retried: a server that dies during one may have done part of it. The call
fails with a ``ToolError`` that says so, and the model decides.

Opening a session (the stdio process or the HTTP client) and noticing its end is
``gateway.tools.mcp.connection``'s; what the server's tools and results mean to the gateway is
``gateway.tools.mcp.result``'s. This module supervises the connection and makes the calls.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.core.tool import ToolDef
from gateway.errors import ConfigError, ToolError
from gateway.tools.base import NOBODY, BackendKind, Caller, ReportProgress
from gateway.tools.entry import EntryBackend, McpServerEntry
from gateway.tools.mcp.connection import Connection, Endpoint, list_tools
from gateway.tools.mcp.result import (
    definitions_of,
    describe_failure,
    leaf_of,
    progress_payload,
    tool_result,
)

__all__ = ["McpTools"]

log = structlog.get_logger("gateway.tools")

_FIRST_RETRY_DELAY = 0.5
_MAX_RETRY_DELAY = 30.0
_STABLE_AFTER = 10.0
"""Seconds a connection must live to count as healthy: a server that keeps dying sooner
is restarted ever more slowly (the first crash restarts it at once)."""
_CLOSE_TIMEOUT = 10.0
"""Seconds ``aclose`` waits for the supervisor (a stdio server gets ~4 s to exit)."""
_REASON_TIMEOUT = 1.0
"""Seconds a failed call waits for the supervisor to learn why the connection ended."""


class _Unreachable(Exception):
    """A connection attempt failed; the message says why, for the agent's author."""


class McpTools(EntryBackend):
    """The tools of one MCP server, as a ``gateway.tools.base.ToolBackend``.

    Takes the same arguments as ``gateway.tools.mcp.connection.Endpoint``, and raises the same
    ``ConfigError`` for a bad entry.
    """

    kind: BackendKind = "mcp"

    def __init__(self, entry: McpServerEntry, base_dir: Path) -> None:
        self._endpoint = Endpoint(entry, base_dir)
        super().__init__(entry)
        self._entry = entry
        self._definitions: tuple[ToolDef, ...] = ()
        self._originals: dict[str, str] = {}
        """The server's own name of each tool, by ours."""
        self._listeners: list[Callable[[], None]] = []
        self._conn: Connection | None = None
        self._up = asyncio.Event()
        """Set while ``_conn`` is live, and once the supervisor has stopped for good."""
        self._supervisor: asyncio.Task[None] | None = None
        self._stop: anyio.CancelScope | None = None
        """Made in ``start``: an agent file may be loaded before the event loop runs."""
        self._stopped = False
        self._ever_connected = False
        self._last_error = "not started"

    @property
    def connected(self) -> bool:
        """Whether a session with the server is live now (for status displays)."""
        return self._conn is not None and not self._conn.lost.is_set()

    async def start(self) -> None:
        """Connect, initialize and list the tools, within ``connect_timeout``.

        An optional server that cannot be reached is tried again in the background; the
        change listeners are called once it connects.

        Raises:
            ConfigError: the server cannot be reached (why: command not found, exited,
                connection refused, timed out...) or its tools do not match the agent file.
        """
        if self._supervisor is not None:
            raise RuntimeError(f"{self.name}: started twice")
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = anyio.CancelScope()
        self._supervisor = asyncio.create_task(self._supervise(first), name=self.name)
        try:
            await first
        except ConfigError:
            if not self.optional:  # an optional one goes on trying in the background
                await self.aclose()
            raise
        except asyncio.CancelledError:
            await self.aclose()
            raise

    def definitions(self) -> Sequence[ToolDef]:
        return self._definitions

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,  # not sent: the agent file's headers speak for the gateway
    ) -> Any:
        """Call the tool ``name`` (ours) on the server; see ``ToolBackend.call``.

        A server that is down is waited for up to ``connect_timeout``. Cancelling the
        awaiting task cancels the call: the SDK sends ``notifications/cancelled``.

        Raises:
            ToolError: the tool reported an error, the server answered with an MCP error,
                or the server stopped during the call (which is not retried).
        """
        original = self._originals.get(name)
        if original is None:
            raise ToolError(f"MCP server {self._entry.name!r} offers no tool {name!r} any more")
        conn = await self._live_connection()
        assert conn.session is not None
        finished = False
        send_progress = progress

        async def report(progress: float, total: float | None, message: str | None) -> None:
            # The SDK runs these in tasks of its own: one may come after the call ended.
            if finished:
                return
            send_progress(progress_payload(progress, total, message))

        try:
            result = await conn.session.call_tool(original, args, progress_callback=report)
        except MCPError as exc:
            if exc.code != types.CONNECTION_CLOSED and not conn.lost.is_set():
                raise ToolError(f"MCP error {exc.code}: {exc.message}") from exc
            self._lose(conn, exc.message)
            with suppress(TimeoutError):  # the supervisor may know better what happened
                async with asyncio.timeout(_REASON_TIMEOUT):
                    await conn.ended.wait()
            raise ToolError(
                f"MCP server {self._entry.name!r} stopped during the call: {conn.reason};"
                " the call was not retried"
            ) from exc
        except (RuntimeError, ValidationError) as exc:
            # The SDK checks results: structured content against the output schema...
            raise ToolError(
                f"MCP server {self._entry.name!r} sent an unusable result: {exc}"
            ) from exc
        finally:
            finished = True
        return tool_result(result)

    async def aclose(self) -> None:
        """Stop the supervisor: end the session, and the stdio server's process."""
        task = self._supervisor
        if self._stop is not None:
            self._stop.cancel()
        if task is None:
            return
        if not task.done():
            done, _ = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT)
            if not done:
                log.warning("mcp_server_close_timed_out", server=self._entry.name)
                task.cancel()
                await asyncio.wait({task})
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("mcp_supervisor_failed", server=self._entry.name, error=repr(error))

    async def _live_connection(self) -> Connection:
        """The live connection, waiting up to ``connect_timeout`` for a reconnection."""
        try:
            async with asyncio.timeout(self._entry.connect_timeout):
                while True:
                    conn = self._conn
                    if conn is not None and not conn.lost.is_set():
                        return conn
                    if self._stopped or self._supervisor is None:
                        raise ToolError(
                            f"MCP server {self._entry.name!r} is not connected"
                            f" ({self._last_error}); the call was not made"
                        )
                    await self._up.wait()
        except TimeoutError as exc:
            raise ToolError(
                f"MCP server {self._entry.name!r} is not connected ({self._last_error}),"
                f" still after {self._entry.connect_timeout:g} s; the call was not made"
            ) from exc

    def _lose(self, conn: Connection, reason: str) -> None:
        """``conn`` is gone; synchronous, so no call picks it up in between."""
        if not conn.lost.is_set():
            conn.reason = reason
            conn.lost.set()
        if self._conn is conn:
            self._conn = None
            self._up.clear()

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        """Connect and serve; connect again with backoff whenever the connection ends."""
        failures = 0  # attempts in a row that could not connect
        young = 0  # connections in a row that died soon after connecting: a crash loop
        assert self._stop is not None
        try:
            with self._stop:
                while True:
                    # One crash reconnects at once; more of them, and failures, back off.
                    await anyio.sleep(_retry_delay(failures + max(young - 1, 0)))
                    try:
                        lived = await self._connect_and_serve(first)
                    except _Unreachable as exc:
                        failures += 1
                        self._last_error = str(exc)
                        if not first.done():
                            first.set_exception(
                                ConfigError(f"MCP server {self._entry.name!r}: {exc}")
                            )
                            if not self.optional:
                                return
                        log.warning(
                            "mcp_server_connect_failed",
                            server=self._entry.name,
                            error=str(exc),
                            retry_in=_retry_delay(failures + max(young - 1, 0)),
                        )
                        continue
                    if lived is None:  # its tools do not match the agent file: give up
                        return
                    failures = 0
                    young = 0 if lived >= _STABLE_AFTER else young + 1
        except Exception as exc:
            log.exception("mcp_supervisor_failed", server=self._entry.name)
            self._last_error = f"internal error: {exc!r}"
        finally:
            self._stopped = True
            self._conn = None
            self._up.set()  # wakes the calls waiting for a connection, to fail
            if not first.done():
                first.set_exception(ConfigError(f"{self.name}: {self._last_error}"))

    async def _connect_and_serve(self, first: asyncio.Future[None]) -> float | None:
        """One connection, from connecting to its loss.

        Returns:
            Seconds it lived; ``None`` when its tools do not match the agent file and it
            never connected before (reported through ``first``: nothing to retry).

        Raises:
            _Unreachable: it could not connect, initialize and list the tools within
                ``connect_timeout``.
        """
        conn = Connection()
        timeout = self._entry.connect_timeout
        # One scope around the whole connection: anyio scopes must nest, and the transport
        # outlives the handshake. Its deadline is lifted once the tools are listed.
        deadline = anyio.CancelScope(deadline=anyio.current_time() + timeout)
        connected_at: float | None = None
        try:
            with deadline:
                async with AsyncExitStack() as stack:
                    tasks = await self._endpoint.open_session(stack, conn, self._lose)
                    assert conn.session is not None
                    await conn.session.initialize()
                    listed = await list_tools(conn.session, self._entry.name)
                    definitions, originals, problem = definitions_of(listed, self._entry, self.name)
                    if problem is not None and not self._ever_connected:
                        self._last_error = problem
                        if first.done():  # an optional server, tried again in the background
                            log.error(
                                "mcp_tools_mismatched", server=self._entry.name, problem=problem
                            )
                        else:
                            first.set_exception(ConfigError(f"{self.name}: {problem}"))
                        return None
                    if problem is not None:
                        log.warning(
                            "mcp_tools_mismatched", server=self._entry.name, problem=problem
                        )
                    deadline.deadline = math.inf
                    connected_at = anyio.current_time()
                    self._install(conn, definitions, originals, first)
                    tasks.start_soon(self._watch_list, conn)
                    await conn.lost.wait()
                    conn.ending = True
                    tasks.cancel_scope.cancel()
        except BaseException as exc:
            # A group may hold a cancellation next to what went wrong; ours (aclose) and
            # anything but an Exception go on up.
            leaf = leaf_of(exc)
            stopping = self._stop is not None and self._stop.cancel_called
            if stopping or not isinstance(leaf, Exception):
                raise
            reason = describe_failure(exc, self._entry)
            if connected_at is None:
                raise _Unreachable(reason) from exc
            if conn.ending:  # the transport complaining about its own teardown
                log.debug("mcp_teardown_failed", server=self._entry.name, error=reason)
            else:  # what broke the transport says more than "connection closed"
                conn.reason = reason
        finally:
            self._lose(conn, "the connection ended")
            conn.ended.set()
        if connected_at is None:
            raise _Unreachable(f"no answer within connect_timeout ({timeout:g} s)")
        log.warning("mcp_server_lost", server=self._entry.name, reason=conn.reason)
        self._last_error = f"connection lost: {conn.reason}"
        return anyio.current_time() - connected_at

    async def _watch_list(self, conn: Connection) -> None:
        """List the tools again each time the server says they changed."""
        assert conn.session is not None
        while True:
            await conn.relist.wait()
            conn.relist.clear()
            try:
                with anyio.fail_after(self._entry.connect_timeout):
                    listed = await list_tools(conn.session, self._entry.name)
            except (MCPError, TimeoutError, ValidationError) as exc:
                log.warning("mcp_tools_list_failed", server=self._entry.name, error=str(exc))
                continue
            definitions, originals, problem = definitions_of(listed, self._entry, self.name)
            if problem is not None:
                log.warning("mcp_tools_mismatched", server=self._entry.name, problem=problem)
            self._replace(definitions, originals)

    def _install(
        self,
        conn: Connection,
        definitions: tuple[ToolDef, ...],
        originals: dict[str, str],
        first: asyncio.Future[None],
    ) -> None:
        """A new connection is up: calls may use it, and its tools replace the old ones."""
        event = "mcp_server_reconnected" if self._ever_connected else "mcp_server_connected"
        self._ever_connected = True
        self._conn = conn
        self._up.set()
        self._last_error = ""
        log.info(event, server=self._entry.name, tools=len(definitions))
        if first.done():
            self._replace(definitions, originals)
        else:
            self._definitions, self._originals = definitions, originals
            first.set_result(None)

    def _replace(self, definitions: tuple[ToolDef, ...], originals: dict[str, str]) -> None:
        """New tools (after a change or a reconnection): the listeners hear of a change."""
        before = {d.name for d in self._definitions}
        changed = definitions != self._definitions
        self._definitions, self._originals = definitions, originals
        if not changed:
            return
        after = {d.name for d in definitions}
        log.info(
            "mcp_tools_changed",
            server=self._entry.name,
            added=sorted(after - before),
            removed=sorted(before - after),
        )
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("mcp_change_listener_failed", server=self._entry.name)


def _retry_delay(setbacks: int) -> float:
    """0, then 0.5 s doubling up to 30 s."""
    if setbacks <= 0:
        return 0.0
    return float(min(_FIRST_RETRY_DELAY * 2 ** (setbacks - 1), _MAX_RETRY_DELAY))

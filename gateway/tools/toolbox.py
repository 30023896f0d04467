"""An agent's server tools from all its backends, under one name each: the ``Toolbox``.

The driver, the workbench (``POST /v1/tools/{name}/test``) and the CLI (``gateway tools``) see
only the toolbox, never a backend (``tools.base``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from gateway.core.tool import ToolDef, ToolRegistry, check_tool
from gateway.errors import ConfigError, ToolError
from gateway.tools.base import NOBODY, Caller, ReportProgress, Resumable, ToolBackend, tool_name

__all__ = ["ToolRow", "Toolbox"]

log = structlog.get_logger("gateway.tools")


@dataclass(frozen=True, slots=True)
class ToolRow:
    """One tool as ``gateway tools list`` shows it."""

    definition: ToolDef
    backend: str
    """The backend's name; ``client`` for a client function."""


class Toolbox:
    """An agent's server tools from all its backends, and its client functions.

    Every tool has one name: a Python tool or a client function keeps the agent author's; a
    tool of an MCP server or an OpenAPI document whose name another tool has too is prefixed
    with its backend's (``files_search``). Two Python tools with the same name, or a clash
    the prefix does not settle, are startup errors.
    """

    def __init__(
        self,
        backends: Sequence[ToolBackend],
        client_functions: Sequence[ToolDef] = (),
        *,
        confirm_mcp_writes: bool = False,
    ) -> None:
        self.backends = tuple(backends)
        self._client_functions = tuple(client_functions)
        self._confirm_mcp_writes = confirm_mcp_writes
        """Every MCP tool not annotated read-only needs the user's confirmation."""
        self._routes: dict[str, tuple[ToolBackend, str]] = {}
        self._rows: list[ToolRow] = []
        self._started = False
        self.registry = self._build(strict=True)
        """Every tool the agent offers now: new sessions start with these."""
        for backend in self.backends:
            backend.on_change(self._refresh)

    async def start(self) -> None:
        """Start every backend (concurrently); an optional one that fails is left out.

        Raises:
            ConfigError: a backend that is not optional could not start, or the tools clash.
        """
        results = await asyncio.gather(
            *(backend.start() for backend in self.backends), return_exceptions=True
        )
        for backend, result in zip(self.backends, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if not isinstance(result, BaseException):
                continue
            if not isinstance(result, ConfigError | ToolError | OSError):
                raise result
            if not backend.optional:
                await self.aclose()
                raise ConfigError(f"{backend.name}: {result}") from result
            log.warning("tool_backend_unavailable", backend=backend.name, error=str(result))
        self._started = True
        self.registry = self._build(strict=True)

    def rows(self) -> list[ToolRow]:
        """Every tool with the backend it runs in, in the registry's order."""
        return list(self._rows)

    def backend_of(self, name: str) -> ToolBackend | None:
        """The backend running the server tool called ``name``, or ``None``."""
        route = self._routes.get(name)
        return route[0] if route else None

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,
    ) -> Any:
        """Run the server tool called ``name`` with checked ``args`` (see ``ToolBackend.call``).

        Raises:
            ToolError: no backend runs such a tool (any more), or the tool failed.
        """
        route = self._routes.get(name)
        if route is None:
            raise ToolError(f"no server tool {name!r} is offered any more")
        backend, own_name = route
        return await backend.call(own_name, args, progress, caller)

    async def resume(
        self,
        name: str,
        handle: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,
    ) -> Any:
        """Follow a call of the server tool ``name`` that another node started, from the
        ``handle`` it kept (see ``Resumable``).

        Raises:
            ToolError: no backend runs such a tool, its backend cannot re-attach, or the
                tool failed.
        """
        route = self._routes.get(name)
        if route is None:
            raise ToolError(f"no server tool {name!r} is offered any more")
        backend, own_name = route
        if not isinstance(backend, Resumable):
            raise ToolError(f"{backend.name} cannot re-attach to a call another node started")
        return await backend.resume(own_name, handle, progress, caller)

    async def aclose(self) -> None:
        """Close every backend (their connections, their processes)."""
        for backend in self.backends:
            try:
                await backend.aclose()
            except Exception:
                log.exception("tool_backend_close_failed", backend=backend.name)

    def _refresh(self) -> None:
        """A backend's tools changed: rebuild, leaving out what no longer fits."""
        before = set(self._routes)
        self.registry = self._build(strict=False)
        log.info(
            "tools_changed",
            added=sorted(set(self._routes) - before),
            removed=sorted(before - set(self._routes)),
        )

    def _build(self, *, strict: bool) -> ToolRegistry:
        """The registry of every tool, named as the class docstring says.

        With ``strict``, a bad tool is a ``ConfigError``; without (a refresh while serving),
        it is left out with a warning.
        """
        owned: list[tuple[ToolBackend | None, ToolDef]] = []
        for source in self.backends:
            owned += [(source, d) for d in source.definitions()]
        owned += [(None, d) for d in self._client_functions]
        counts = Counter(d.name for _, d in owned)
        names: set[str] = set()
        routes: dict[str, tuple[ToolBackend, str]] = {}
        rows: list[ToolRow] = []
        definitions: list[ToolDef] = []
        for backend, definition in owned:
            external = backend is not None and backend.kind != "python"
            if (
                self._confirm_mcp_writes
                and backend is not None
                and backend.kind == "mcp"
                and definition.read_only is not True
            ):
                definition = msgspec.structs.replace(definition, confirm=True)
            exposed = definition.name
            if external and counts[exposed] > 1:
                assert backend is not None
                exposed = tool_name(f"{backend.prefix}_{exposed}")
            problem = None
            if exposed in names:
                problem = f"tool {exposed!r}: defined twice"
                if external:
                    problem += " (even prefixed with its backend's name)"
            else:
                try:
                    check_tool(msgspec.structs.replace(definition, name=exposed))
                except ConfigError as exc:
                    problem = str(exc)
            if problem is not None:
                where = backend.name if backend is not None else "client functions"
                if strict:
                    raise ConfigError(f"{where}: {problem}")
                log.warning("tool_left_out", backend=where, reason=problem)
                continue
            names.add(exposed)
            definitions.append(msgspec.structs.replace(definition, name=exposed))
            rows.append(ToolRow(definitions[-1], backend.name if backend else "client"))
            if backend is not None:
                routes[exposed] = (backend, definition.name)
        registry = ToolRegistry(definitions)
        self._routes, self._rows = routes, rows
        return registry

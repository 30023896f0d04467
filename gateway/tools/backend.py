"""How server tools run, apart from what they are: the ``ToolBackend`` seam and the ``Toolbox``.

A tool *is* a ``gateway.core.tool.ToolDef`` (name, description, schemas, sync or async,
delivery, timeout, flags); it *runs* in a backend: Python functions (``tools.python``), an MCP
server (``tools.mcp``) or an HTTP API described by OpenAPI (``tools.openapi``).
The ``Toolbox`` puts an agent's backends together under unique names; the driver, the workbench
(``POST /v1/tools/{name}/test``) and the CLI (``gateway tools``) see only the toolbox.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import msgspec
import structlog

from gateway.core.principal import Principal
from gateway.core.tool import Delivery, Execution, ToolDef, ToolRegistry, check_tool
from gateway.errors import ConfigError, ToolError, ToolForbidden

__all__ = [
    "AgentToolEntry",
    "BackendKind",
    "Caller",
    "EntryBackend",
    "McpServerEntry",
    "OpenApiEntry",
    "ReportProgress",
    "ToolBackend",
    "ToolOptions",
    "ToolRow",
    "Toolbox",
    "check_options_known",
    "expand_env",
    "failure_code",
    "tool_failure",
    "tool_name",
    "with_options",
]

log = structlog.get_logger("gateway.tools")

BackendKind = Literal["python", "mcp", "openapi", "agent", "system"]

ReportProgress = Callable[[Any], None]
"""Sends ``tool.status progress`` with a JSON-compatible payload; callable from any thread."""


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """On whose behalf a tool runs: the session's user, as their client token says.

    A Python tool declares a parameter annotated ``Caller`` to get it (docs/tools.md).
    """

    principal: str
    """The session's owner: ``key:backend/user:42``, ``key:backend``, ``anonymous``."""
    user_id: str | None = None
    """The end user a client token was minted for; ``None`` without one."""
    scopes: tuple[str, ...] = ()
    claims: dict[str, Any] = msgspec.field(default_factory=dict)
    """The user's other claims, as the backend that minted the token stated them."""
    time_zone: str | None = None
    """The user's time zone, when their app sent one (``session.start``)."""

    @classmethod
    def of(cls, principal: Principal, time_zone: str | None = None) -> Caller:
        return cls(
            principal=principal.name,
            user_id=principal.user_id,
            scopes=principal.scopes,
            claims=principal.claims,
            time_zone=time_zone,
        )


NOBODY = Caller(principal="nobody")
"""The caller of a tool run outside any session (``gateway tools test``, the HTTP console
with no user)."""


class ToolOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an agent file may set on one tool of a backend (``tool_options.NAME``)."""

    execution: Execution | None = None
    delivery: Delivery | None = None
    timeout: float | None = None
    display_name: str | None = None
    scopes: list[str] | None = None
    """Scopes the session's user must all have for a call to run."""
    confirm: bool | None = None
    """A call runs only once the user (or ``confirm_rule``) approved it."""
    confirm_prompt: str | None = None
    """What the user is asked, with ``{arg}`` placeholders."""
    confirm_rule: str | None = None
    """``module:function`` or ``file.py:function`` deciding without asking (docs/tools.md)."""


_BackendName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]


class McpServerEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An MCP server whose tools the agent offers (``[[mcp_servers]]`` in an agent file):
    a stdio ``command`` the gateway starts, or a streamable-HTTP ``url``."""

    name: _BackendName
    """Names the backend (``mcp:NAME``) and prefixes its tools' names where they clash."""
    command: list[str] = []
    """stdio: the program and its arguments, run in ``cwd``."""
    env: dict[str, str] = {}
    """stdio: variables added to the gateway's environment for the server; ``${VAR}`` in a
    value is the gateway's own variable."""
    cwd: str | None = None
    """stdio: the server's working directory, relative to the agent file's (the default)."""
    url: str | None = None
    """Streamable HTTP: the server's endpoint, e.g. ``http://127.0.0.1:9000/mcp``."""
    headers: dict[str, str] = {}
    """Streamable HTTP: sent with every request; ``${VAR}`` in a value is the gateway's
    environment variable (``Authorization = "Bearer ${FILES_TOKEN}"``)."""
    optional: bool = False
    """Unreachable at startup: a warning (and retried in the background), not an error."""
    connect_timeout: float = 10.0
    """Seconds to connect and list the tools."""
    timeout: float | None = None
    """Seconds a call of its tools may take; ``None`` takes the gateway's server-tool one."""
    tools: list[str] | None = None
    """Only these tools (the server's names); ``None`` offers all."""
    tool_options: dict[str, ToolOptions] = {}
    """By the server's tool name: execution, delivery, timeout, display name."""


class OpenApiEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An HTTP API described by an OpenAPI 3.x document (``[[openapi]]`` in an agent file):
    each operation is a tool."""

    name: _BackendName
    """Names the backend (``openapi:NAME``) and prefixes its tools' names where they clash."""
    document: str
    """A JSON or YAML file (relative to the agent file) or an ``http(s)://`` URL."""
    base_url: str | None = None
    """Where calls go; by default the document's first ``servers`` URL (resolved against
    the document's own URL)."""
    operations: list[str] | None = None
    """Only these operations (``operationId``, or ``METHOD /path``); ``None`` offers all."""
    headers: dict[str, str] = {}
    """Sent with every call; ``${VAR}`` in a value is the gateway's environment variable."""
    timeout: float = 10.0
    """Seconds one HTTP call may take."""
    optional: bool = False
    """Unreachable document at startup: a warning, not an error."""
    tool_options: dict[str, ToolOptions] = {}
    """By the tool's name (as the gateway names the operation): execution, delivery,
    timeout, display name."""


class AgentToolEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Another agent offered as a tool (``[[agent_tools]]`` in an agent file): calling it
    runs that agent's turn to completion and returns its final text."""

    name: _BackendName
    """The tool's name (and the backend's: ``agent:NAME``)."""
    file: str
    """The other agent's file, relative to this one."""
    description: Annotated[str, msgspec.Meta(min_length=1)]
    """What the model reads: what to ask this agent for."""
    display_name: str | None = None
    execution: Execution = "sync"
    """``async`` for an agent whose turn takes long: the model gets pending at once."""
    timeout: float | None = None
    """Seconds its whole turn may take; ``None`` takes the gateway's server-tool one."""
    max_steps: Annotated[int, msgspec.Meta(ge=1, le=50)] = 8
    """Model steps its turn may take."""
    optional: bool = False
    """A file that cannot be loaded (or whose tools cannot start): a warning, not an error."""


class ToolBackend(Protocol):
    """Where a set of server tools runs.

    A backend lists its tools under its own names; the toolbox may expose one under another
    name (prefixed with the backend's, on a clash) and calls it with the backend's name.
    """

    @property
    def name(self) -> str:
        """``python``, ``mcp:NAME`` or ``openapi:NAME``: in listings, logs and errors."""
        ...

    @property
    def kind(self) -> BackendKind: ...

    @property
    def prefix(self) -> str:
        """What a tool's name is prefixed with (and ``_``) when it clashes with another's."""
        ...

    @property
    def optional(self) -> bool:
        """A backend that cannot start is a warning, not a startup error."""
        ...

    async def start(self) -> None:
        """Connect, load, list the tools.

        Raises:
            ConfigError: the backend cannot be reached or its tools are unusable.
        """
        ...

    def definitions(self) -> Sequence[ToolDef]:
        """The tools this backend offers now (empty before ``start``), by its own names."""
        ...

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever ``definitions`` changes (a server announced it)."""
        ...

    async def call(
        self, name: str, args: dict[str, Any], progress: ReportProgress, caller: Caller = ...
    ) -> Any:
        """Run the tool called ``name`` (the backend's name) with checked ``args``, on
        behalf of ``caller`` (a backend that has no use for it ignores it).

        Cancelling the awaiting task cancels the call (the backend tells its server when it
        can).

        Returns:
            The result, JSON-compatible.

        Raises:
            ToolError: the tool failed; its message is what the model sees.
        """
        ...

    async def aclose(self) -> None: ...


class EntryBackend:
    """What a backend an agent file names (an MCP server, an OpenAPI document) is called:
    ``KIND:NAME``, its tools prefixed with ``NAME`` on a clash, optional as the file says."""

    kind: BackendKind

    def __init__(self, entry: McpServerEntry | OpenApiEntry | AgentToolEntry) -> None:
        self._named = entry

    @property
    def name(self) -> str:
        return f"{self.kind}:{self._named.name}"

    @property
    def prefix(self) -> str:
        return self._named.name

    @property
    def optional(self) -> bool:
        return self._named.optional


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


def tool_failure(exc: Exception) -> str:
    """What the model sees of a tool's failure: a ``ToolError``'s own message (the backends
    word theirs), else the exception's type and message (a Python tool's bug)."""
    if isinstance(exc, ToolError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def failure_code(exc: Exception) -> str | None:
    """The code of a tool's failure, for ``tool.status``: ``forbidden`` or none."""
    return "forbidden" if isinstance(exc, ToolForbidden) else None


def tool_name(name: str) -> str:
    """A tool name as the gateway allows it (snake_case, 64 characters at most) made of any
    name an MCP server or an OpenAPI document gives: ``getOrder`` -> ``get_order``,
    ``files.read-text`` -> ``files_read_text``."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    snake = re.sub(r"[^a-z0-9]+", "_", snake.lower()).strip("_")
    if not snake or not snake[0].isalpha():
        snake = f"t_{snake}"
    return snake[:64].rstrip("_")


def with_options(definition: ToolDef, options: ToolOptions | None) -> ToolDef:
    """``definition`` with what the agent file sets for it."""
    if options is None:
        return definition
    changes = {
        field: value
        for field in (
            "execution",
            "delivery",
            "timeout",
            "display_name",
            "confirm",
            "confirm_prompt",
            "confirm_rule",
        )
        if (value := getattr(options, field)) is not None
    }
    if options.scopes is not None:
        changes["scopes"] = tuple(options.scopes)
    return msgspec.structs.replace(definition, **changes) if changes else definition


def check_options_known(
    backend: str, options: Mapping[str, ToolOptions], offered: Sequence[str]
) -> None:
    """A ``tool_options`` entry for a tool the backend does not offer is a mistake.

    Raises:
        ConfigError: naming the backend and the tool.
    """
    for name in options:
        if name not in offered:
            raise ConfigError(
                f"{backend}: tool_options names {name!r}, which it does not offer"
                f" (it offers: {', '.join(sorted(offered)) or 'nothing'})"
            )


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(value: str, where: str, environ: Mapping[str, str] | None = None) -> str:
    """``value`` with each ``${NAME}`` replaced by that environment variable, so secrets
    stay out of agent files (``Authorization = "Bearer ${SHOP_TOKEN}"``).

    Raises:
        ConfigError: a variable is not set; ``where`` says whose value it is.
    """
    env = os.environ if environ is None else environ

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"{where}: environment variable {name} is not set")
        return env[name]

    return _VARIABLE.sub(replace, value)

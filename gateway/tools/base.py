"""How a server tool runs, apart from what it is: the ``ToolBackend`` seam.

A tool *is* a ``gateway.core.tool.ToolDef`` (name, description, schemas, sync or async,
delivery, timeout, flags); it *runs* in a backend: Python functions (``tools.python``), an MCP
server (``tools.mcp``) or an HTTP API described by OpenAPI (``tools.openapi``). Here is what
every backend promises (``ToolBackend``), whom a call runs for (``Caller``), and what the model
and the client see of a failure. The ``Toolbox`` (``tools.toolbox``) puts an agent's backends
together; what an agent file says about a backend is in ``tools.entry``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from gateway.core.principal import Principal
from gateway.core.tool import ToolDef
from gateway.errors import ToolError, ToolForbidden

__all__ = [
    "NOBODY",
    "BackendKind",
    "Caller",
    "ReportProgress",
    "Resumable",
    "ToolBackend",
    "failure_code",
    "tool_failure",
    "tool_name",
]

BackendKind = Literal["python", "mcp", "openapi", "a2a", "agent", "system"]

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
    session_id: str | None = None
    """The session the call runs in; ``None`` outside one (``gateway tools test``)."""

    @classmethod
    def of(
        cls, principal: Principal, time_zone: str | None = None, session_id: str | None = None
    ) -> Caller:
        return cls(
            principal=principal.name,
            user_id=principal.user_id,
            scopes=principal.scopes,
            claims=principal.claims,
            time_zone=time_zone,
            session_id=session_id,
        )


NOBODY = Caller(principal="nobody")
"""The caller of a tool run outside any session (``gateway tools test``, the HTTP console
with no user)."""


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


@runtime_checkable
class Resumable(Protocol):
    """A backend whose calls' work outlives the node that started it (a remote agent's
    task): a call reports where its work is (``Progress.keep``), and a node that takes the
    session over follows it from there instead of losing the call."""

    async def resume(
        self, name: str, handle: dict[str, Any], progress: ReportProgress, caller: Caller = ...
    ) -> Any:
        """Follow the work a call of tool ``name`` kept ``handle`` for, to its result, as
        ``call`` would have.

        Raises:
            ToolError: as ``call``; or the work cannot be found again.
        """
        ...


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

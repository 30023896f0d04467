"""Server tools: Python functions the gateway runs as tools, on the event loop.

``@tool`` makes a ``ServerTool`` of a function: its input and output are msgspec
Structs, so the JSON Schema the model sees is generated from the types and cannot
drift from the code. The definition it builds is a ``gateway.tools.ToolDef`` like
any other; running the function (a worker thread for plain functions, progress
reports through the loop) is the shell's business, so it lives here, apart from
the pure core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

import msgspec

from gateway.errors import ConfigError
from gateway.protocol import struct_schema
from gateway.tool_backend import NOBODY, BackendKind, Caller, ToolOptions, with_options
from gateway.tools import Delivery, Execution, ToolDef, check_tool, default_display_name

__all__ = ["Caller", "Progress", "PythonTools", "ServerTool", "tool"]


class Progress:
    """Passed to a tool that declares a ``Progress`` parameter: ``progress(payload)``
    sends ``tool.status progress`` with any JSON-compatible payload. Thread-safe, so
    plain functions running in a worker thread may call it too."""

    __slots__ = ("_loop", "_report")

    def __init__(self, report: Callable[[Any], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._report = report

    def __call__(self, payload: Any) -> None:
        builtins = msgspec.to_builtins(payload)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._report(builtins)
        else:
            self._loop.call_soon_threadsafe(self._report, builtins)


@dataclass(frozen=True, slots=True)
class ServerTool:
    """A Python function the gateway runs as a tool. Build it with ``@tool``."""

    definition: ToolDef
    func: Callable[..., Any]
    input_type: type[msgspec.Struct] | None
    takes_progress: bool = False
    takes_caller: bool = False

    async def invoke(
        self,
        args: dict[str, Any],
        progress: Callable[[Any], None] | None = None,
        caller: Caller = NOBODY,
    ) -> Any:
        """Run the function with ``args`` (already checked against the input schema).

        A plain function runs in a worker thread so it cannot block the event loop;
        such a thread cannot be interrupted, so a timeout abandons it.

        Returns:
            The result as JSON-compatible builtins.
        """
        call_args: list[Any] = []
        if self.input_type is not None:
            call_args.append(msgspec.convert(args, self.input_type))
        if self.takes_progress:
            if not isinstance(progress, Progress):  # thread-safe, whatever the caller gave
                progress = Progress(progress or (lambda _: None))
            call_args.append(progress)
        if self.takes_caller:
            call_args.append(caller)
        if inspect.iscoroutinefunction(self.func):
            result = await self.func(*call_args)
        else:
            result = await asyncio.to_thread(self.func, *call_args)
        return msgspec.to_builtins(result)

    def with_options(self, options: ToolOptions) -> ServerTool:
        """The same tool with what the agent file sets for it (timeout, delivery, scopes,
        confirmation) replacing what ``@tool`` said."""
        return dataclasses.replace(self, definition=with_options(self.definition, options))


def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    display_name: str | None = None,
    timeout: float | None = None,
    execution: Execution = "sync",
    delivery: Delivery = "when_idle",
    read_only: bool | None = None,
    scopes: tuple[str, ...] = (),
    confirm: bool = False,
    confirm_prompt: str | None = None,
) -> Callable[[Callable[..., Any]], ServerTool]:
    """Make a server tool of a function taking (at most) one msgspec Struct.

    The description defaults to the docstring; schemas come from the type hints.
    A parameter annotated ``Progress`` receives a progress reporter.

    Args:
        execution: ``sync`` runs inside the turn; ``async`` answers the model
            ``{"status": "pending"}`` at once and delivers the result later.
        delivery: for async tools, how the result reaches the model:
            ``when_idle``, ``interrupt`` or ``silent`` (see docs/agents.md).
        read_only: the tool changes nothing (kept for confirmation rules).
        scopes: the session's user must have every one of these for a call to run.
        confirm: a call runs only once the user approved it (``tool.confirm``).
        confirm_prompt: what the user is asked, with ``{arg}`` placeholders.

    Raises:
        ConfigError: a parameter without a type annotation, more than one argument, an
            argument that is not a msgspec Struct, a bad name or description.

    Example:
        >>> class StockQuery(msgspec.Struct):
        ...     product: str
        >>> @tool(timeout=5)
        ... def check_stock(query: StockQuery) -> StockLevel:
        ...     "Tell whether a product is in stock."
    """

    def decorate(func: Callable[..., Any]) -> ServerTool:
        tool_name = name or func.__name__
        hints = get_type_hints(func)
        signature = inspect.signature(func).parameters
        for param in signature:
            if param not in hints:  # it would get no schema, and every call a TypeError
                raise ConfigError(
                    f"tool {tool_name!r}: parameter {param!r} has no type annotation"
                    " (annotate it with a msgspec Struct, or Progress)"
                )
        params = [p for p in signature if hints[p] not in (Progress, Caller)]
        takes_progress = Progress in (hints[p] for p in signature)
        takes_caller = Caller in (hints[p] for p in signature)
        if len(params) > 1:
            raise ConfigError(f"tool {tool_name!r}: takes one msgspec Struct argument at most")
        input_type = hints.get(params[0]) if params else None
        if input_type is not None and not (
            isinstance(input_type, type) and issubclass(input_type, msgspec.Struct)
        ):
            raise ConfigError(f"tool {tool_name!r}: its argument must be a msgspec Struct")
        output_type = hints.get("return")
        output_schema = (
            struct_schema(output_type)
            if isinstance(output_type, type) and issubclass(output_type, msgspec.Struct)
            else None
        )
        definition = ToolDef(
            name=tool_name,
            description=(description or inspect.getdoc(func) or "").strip(),
            kind="server",
            input_schema=(
                struct_schema(input_type)
                if input_type is not None
                else {"type": "object", "properties": {}}
            ),
            output_schema=output_schema,
            display_name=display_name or default_display_name(tool_name),
            timeout=timeout,
            execution=execution,
            delivery=delivery,
            read_only=read_only,
            scopes=tuple(scopes),
            confirm=confirm,
            confirm_prompt=confirm_prompt,
        )
        check_tool(definition)
        return ServerTool(
            definition=definition,
            func=func,
            input_type=input_type,
            takes_progress=takes_progress,
            takes_caller=takes_caller,
        )

    return decorate


class PythonTools:
    """An agent's ``@tool`` functions as a ``gateway.tool_backend.ToolBackend``.

    Raises:
        ConfigError: two tools have the same name (the last would silently win).
    """

    name = "python"
    kind: BackendKind = "python"
    prefix = "python"
    optional = False

    def __init__(self, tools: Sequence[ServerTool]) -> None:
        self._tools: dict[str, ServerTool] = {}
        for found in tools:
            tool_name = found.definition.name
            if tool_name in self._tools:
                raise ConfigError(
                    f"tool {tool_name!r}: defined twice ({_where(self._tools[tool_name])}"
                    f" and {_where(found)})"
                )
            self._tools[tool_name] = found

    async def start(self) -> None:
        """Nothing to connect: the functions were imported with the agent file."""

    def definitions(self) -> list[ToolDef]:
        return [found.definition for found in self._tools.values()]

    def on_change(self, listener: Callable[[], None]) -> None:
        """The functions never change while the gateway runs."""

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: Callable[[Any], None],
        caller: Caller = NOBODY,
    ) -> Any:
        return await self._tools[name].invoke(args, progress, caller)

    async def aclose(self) -> None:
        """Nothing to close."""


def _where(found: ServerTool) -> str:
    return f"{found.func.__module__}.{found.func.__qualname__}"

"""Tool definitions: server tools written in Python, client functions, and their registry.

A tool is described by a ``ToolDef`` (what the model and the client see) whatever
runs it. Server tools are Python functions decorated with ``@tool``: their input
and output are msgspec Structs, so the JSON Schema the model sees is generated
from the types and cannot drift from the code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints

import msgspec

from gateway.errors import ConfigError
from gateway.protocol import struct_schema
from gateway.schema import SchemaValidator, schema_problem
from gateway.schema_guard import SchemaBudget, SchemaGuard

__all__ = [
    "Progress",
    "ServerTool",
    "ToolDef",
    "ToolEntry",
    "ToolRegistry",
    "default_display_name",
    "tool",
]

Kind = Literal["client", "server"]
Execution = Literal["sync", "async"]
Delivery = Literal["when_idle", "interrupt", "silent"]
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def default_display_name(name: str) -> str:
    """``get_battery_level`` -> ``Get battery level``."""
    return name.replace("_", " ").strip().capitalize()


class ToolDef(msgspec.Struct, frozen=True, kw_only=True):
    """What the model and the client know of a tool, whoever runs it."""

    name: str
    description: str
    kind: Kind
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    display_name: str = ""
    timeout: float | None = None
    """Seconds; ``None`` takes the gateway's default for the kind."""
    execution: Execution = "sync"
    delivery: Delivery = "when_idle"


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """A checked definition with its compiled schemas."""

    definition: ToolDef
    input_validator: SchemaValidator
    output_validator: SchemaValidator | None


def _compile(schema: dict[str, Any]) -> SchemaValidator | str:
    """Trusted schemas (the agent's own tools): checked in full, with no limits."""
    problem = schema_problem(schema)
    return problem if problem is not None else SchemaValidator(schema)


def _check(
    definition: ToolDef,
    compile_schema: Callable[[dict[str, Any]], SchemaValidator | str] = _compile,
) -> ToolEntry:
    name = definition.name
    if not _NAME.match(name):
        raise ConfigError(f"tool {name!r}: name must be snake_case (a-z, 0-9, _; 64 at most)")
    if not definition.description.strip():
        raise ConfigError(f"tool {name!r}: description must not be empty")
    if definition.timeout is not None and definition.timeout <= 0:
        raise ConfigError(f"tool {name!r}: timeout must be positive")
    validators: list[SchemaValidator | None] = []
    for field, schema in (
        ("input_schema", definition.input_schema),
        ("output_schema", definition.output_schema),
    ):
        compiled = None if schema is None else compile_schema(schema)
        if isinstance(compiled, str):
            raise ConfigError(f"tool {name!r}: {field}: {compiled}")
        validators.append(compiled)
    if definition.input_schema.get("type") != "object":
        raise ConfigError(f"tool {name!r}: input_schema must have type 'object'")
    input_validator, output_validator = validators
    assert input_validator is not None
    return ToolEntry(
        definition=definition,
        input_validator=input_validator,
        output_validator=output_validator,
    )


class ToolRegistry:
    """An immutable set of checked tools, by name."""

    __slots__ = ("_entries",)

    def __init__(self, definitions: Iterable[ToolDef] = ()) -> None:
        self._entries: dict[str, ToolEntry] = {}
        for definition in definitions:
            self._add(_check(definition))

    def _add(self, entry: ToolEntry) -> None:
        if entry.definition.name in self._entries:
            raise ConfigError(f"tool {entry.definition.name!r}: defined twice")
        self._entries[entry.definition.name] = entry

    def get(self, name: str) -> ToolEntry | None:
        """The tool called ``name``, or ``None``."""
        return self._entries.get(name)

    def extended(
        self, definitions: Iterable[ToolDef], guard: SchemaGuard | None = None
    ) -> ToolRegistry:
        """A new registry with more tools; a name clash is a ``ConfigError``.

        The tools already here are reused as they are, not checked again. With ``guard``
        the new tools' schemas are untrusted (a client's): they must stay within its
        limits, all of them together, and are compiled once per schema through its cache.
        """
        registry = ToolRegistry()
        registry._entries = dict(self._entries)
        compile_schema = _compile
        if guard is not None:
            budget = SchemaBudget()
            compile_schema = functools.partial(guard.compile, budget=budget)
        for definition in definitions:
            # The name first: a clash must not cost a schema check.
            if definition.name in registry._entries:
                raise ConfigError(f"tool {definition.name!r}: defined twice")
            registry._add(_check(definition, compile_schema))
        return registry

    def definitions(self) -> list[ToolDef]:
        """Every definition, in the order they were added."""
        return [entry.definition for entry in self._entries.values()]

    def __iter__(self) -> Iterator[ToolEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


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

    async def invoke(self, args: dict[str, Any], progress: Progress | None = None) -> Any:
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
            call_args.append(progress if progress is not None else Progress(lambda _: None))
        if inspect.iscoroutinefunction(self.func):
            result = await self.func(*call_args)
        else:
            result = await asyncio.to_thread(self.func, *call_args)
        return msgspec.to_builtins(result)

    def with_options(
        self, *, timeout: float | None = None, delivery: Delivery | None = None
    ) -> ServerTool:
        """The same tool with its timeout or delivery replaced (agent files may tune them)."""
        definition = self.definition
        if timeout is not None:
            definition = msgspec.structs.replace(definition, timeout=timeout)
        if delivery is not None:
            definition = msgspec.structs.replace(definition, delivery=delivery)
        return dataclasses.replace(self, definition=definition)


def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    display_name: str | None = None,
    timeout: float | None = None,
    execution: Execution = "sync",
    delivery: Delivery = "when_idle",
) -> Callable[[Callable[..., Any]], ServerTool]:
    """Make a server tool of a function taking (at most) one msgspec Struct.

    The description defaults to the docstring; schemas come from the type hints.
    A parameter annotated ``Progress`` receives a progress reporter.

    Args:
        execution: ``sync`` runs inside the turn; ``async`` answers the model
            ``{"status": "pending"}`` at once and delivers the result later.
        delivery: for async tools, how the result reaches the model:
            ``when_idle``, ``interrupt`` or ``silent`` (see docs/agents.md).

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
        params = [p for p in inspect.signature(func).parameters if hints.get(p) is not Progress]
        takes_progress = Progress in (hints.get(p) for p in inspect.signature(func).parameters)
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
        )
        _check(definition)
        return ServerTool(
            definition=definition, func=func, input_type=input_type, takes_progress=takes_progress
        )

    return decorate

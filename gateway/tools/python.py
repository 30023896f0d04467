"""Server tools: Python functions the gateway runs as tools, on the event loop.

``@tool`` makes a ``ServerTool`` of a function. Its input is either one msgspec Struct (the
Struct's fields are the tool's arguments) or plain typed parameters, as in
``def get_weather(city: str, unit: Literal["c", "f"] = "c") -> Weather``: those become a
Struct made with ``msgspec.defstruct``, so both forms get their JSON Schema from the types
(which cannot drift from the code) and their arguments converted the same way. Parameters
annotated ``Progress`` or ``Caller`` are injected, never arguments. The definition it builds
is a ``gateway.core.tool.ToolDef`` like any other; running the function (a worker thread for
plain functions, progress reports through the loop) is the shell's business, so it lives
here, apart from the pure core.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    Literal,
    TypeGuard,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

import msgspec

from gateway.core.tool import Delivery, Execution, ToolDef, check_tool, default_display_name
from gateway.errors import ConfigError
from gateway.tools.base import NOBODY, BackendKind, Caller
from gateway.tools.entry import ToolOptions, with_options
from gateway.wire.v1 import struct_schema

__all__ = ["Caller", "Progress", "PythonTools", "ServerTool", "ToolParam", "tool"]


class Progress:
    """Passed to a tool that declares a ``Progress`` parameter: ``progress(payload)``
    sends ``tool.status progress`` with any JSON-compatible payload. Thread-safe, so
    plain functions running in a worker thread may call it too.

    Two more reports reach the session a call runs in (outside one, they do nothing):
    ``defer()``, a sync call that will take long turns async (``pending``, the turn goes
    on, the result comes later as a completion); ``keep(handle)``, where the call's work
    can be found again, so that a node taking the session over re-attaches to it (a
    backend that can, ``gateway.tools.base.Resumable``)."""

    __slots__ = ("_defer", "_keep", "_loop", "_report")

    def __init__(
        self,
        report: Callable[[Any], None],
        *,
        defer: Callable[[], None] | None = None,
        keep: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._report = report
        self._defer = defer
        self._keep = keep

    def __call__(self, payload: Any) -> None:
        self._on_loop(self._report, msgspec.to_builtins(payload))

    def defer(self) -> None:
        """This sync call will take long: the session turns it async."""
        if (defer := self._defer) is not None:
            self._on_loop(lambda _: defer(), None)

    def keep(self, handle: dict[str, Any]) -> None:
        """Where this call's work can be found again (JSON-compatible, kept with the call)."""
        if self._keep is not None:
            self._on_loop(self._keep, msgspec.to_builtins(handle))

    def _on_loop(self, report: Callable[[Any], None], value: Any) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            report(value)
        else:
            self._loop.call_soon_threadsafe(report, value)


@dataclass(frozen=True, slots=True)
class ToolParam:
    """One parameter of a tool's function and what it receives when the tool runs."""

    name: str
    role: Literal["input", "argument", "progress", "caller"]
    """``input``: the whole input Struct (the one-Struct form); ``argument``: the input's
    field of this name (plain parameters); ``progress``, ``caller``: injected."""
    keyword: bool = False
    """Keyword-only in the signature: passed by name, the others by position."""


@dataclass(frozen=True, slots=True)
class ServerTool:
    """A Python function the gateway runs as a tool. Build it with ``@tool``."""

    definition: ToolDef
    func: Callable[..., Any]
    input_type: type[msgspec.Struct] | None
    """The Struct the checked arguments are converted to: the function's own (its one
    parameter), or one made of its plain parameters; ``None`` when it takes no argument."""
    params: tuple[ToolParam, ...] = ()

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
        given = None if self.input_type is None else msgspec.convert(args, self.input_type)
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for param in self.params:
            value: Any
            if param.role == "input":
                value = given
            elif param.role == "argument":
                value = getattr(given, param.name)
            elif param.role == "caller":
                value = caller
            elif isinstance(progress, Progress):
                value = progress
            else:  # thread-safe, whatever the caller gave
                value = Progress(progress or (lambda _: None))
            if param.keyword:
                keywords[param.name] = value
            else:
                positional.append(value)
        if inspect.iscoroutinefunction(self.func):
            result = await self.func(*positional, **keywords)
        else:
            result = await asyncio.to_thread(self.func, *positional, **keywords)
        return msgspec.to_builtins(result)

    def with_options(self, options: ToolOptions) -> ServerTool:
        """The same tool with what the agent file sets for it (timeout, delivery, scopes,
        confirmation) replacing what ``@tool`` said."""
        return dataclasses.replace(self, definition=with_options(self.definition, options))


_Decorate = Callable[[Callable[..., Any]], ServerTool]


@overload
def tool(func: Callable[..., Any], /) -> ServerTool: ...


@overload
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
) -> _Decorate: ...


def tool(
    func: Callable[..., Any] | None = None,
    /,
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
) -> ServerTool | _Decorate:
    """Make a server tool of a function: ``@tool`` or ``@tool(...)``.

    The function takes plain typed parameters (``city: str, unit: Literal["c", "f"] =
    "c"``: any type msgspec converts, Structs and TypedDicts included), or one msgspec
    Struct whose fields are the arguments. The input schema comes from the types: a
    parameter without a default is required, and its description is the one of
    ``Annotated[..., msgspec.Meta(description=...)]`` or else of the docstring's ``Args:``
    section. The description defaults to the docstring (without that section). A parameter
    annotated ``Progress`` receives a progress reporter, one annotated ``Caller`` the user
    the call runs for; neither is an argument. Sync and async functions both work.

    Args:
        func: the function, when used bare (``@tool``).
        execution: ``sync`` runs inside the turn; ``async`` answers the model
            ``{"status": "pending"}`` at once and delivers the result later.
        delivery: for async tools, how the result reaches the model:
            ``when_idle``, ``interrupt`` or ``silent`` (see docs/agents.md).
        read_only: the tool changes nothing (kept for confirmation rules).
        scopes: the session's user must have every one of these for a call to run.
        confirm: a call runs only once the user approved it (``tool.confirm``).
        confirm_prompt: what the user is asked, with ``{arg}`` placeholders.

    Raises:
        ConfigError: a parameter without a type annotation or of a type msgspec cannot
            describe, ``*args`` or ``**kwargs``, a docstring naming a parameter the function
            does not have, a bad name or description.

    Example:
        >>> @tool(timeout=5)
        ... def check_stock(product: str, warehouse: str | None = None) -> StockLevel:
        ...     "Tell whether a product is in stock."
    """

    def decorate(func: Callable[..., Any]) -> ServerTool:
        tool_name = name or func.__name__
        summary, documented = _split_docstring(inspect.getdoc(func) or "")
        input_type, params = _inputs(func, tool_name, documented)
        if not any(param.role == "argument" for param in params):
            summary = inspect.getdoc(func) or ""  # no plain parameters: as it always was
        output_type = get_type_hints(func).get("return")
        output_schema = struct_schema(output_type) if _is_struct(output_type) else None
        definition = ToolDef(
            name=tool_name,
            description=(description or summary).strip(),
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
        return ServerTool(definition=definition, func=func, input_type=input_type, params=params)

    if func is None:
        return decorate
    if not callable(func):
        raise TypeError(f"@tool takes a function, or keyword arguments only: got {func!r}")
    return decorate(func)


def _is_struct(hint: Any) -> TypeGuard[type[msgspec.Struct]]:
    return isinstance(hint, type) and issubclass(hint, msgspec.Struct)


def _inputs(
    func: Callable[..., Any], tool_name: str, documented: dict[str, str]
) -> tuple[type[msgspec.Struct] | None, tuple[ToolParam, ...]]:
    """The Struct a tool's arguments are converted to, and what each parameter receives.

    Raises:
        ConfigError: see ``tool``.
    """
    try:
        hints = get_type_hints(func, include_extras=True)
    except (NameError, TypeError) as exc:  # a class defined inside a function, say
        raise ConfigError(f"tool {tool_name!r}: cannot resolve its type hints: {exc}") from exc
    params: list[ToolParam] = []
    fields: list[tuple[Any, ...]] = []
    signature = inspect.signature(func).parameters.values()
    for param in signature:
        where = f"tool {tool_name!r}: parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"{where}: a tool's arguments are named, not *args or **kwargs")
        if param.name not in hints:  # it would get no schema, and every call a TypeError
            raise ConfigError(
                f"{where} has no type annotation (annotate it with a type, a msgspec Struct,"
                " Progress or Caller)"
            )
        hint = hints[param.name]
        keyword = param.kind is param.KEYWORD_ONLY
        if hint is Progress or hint is Caller:
            role: Literal["progress", "caller"] = "progress" if hint is Progress else "caller"
            params.append(ToolParam(param.name, role, keyword))
            continue
        params.append(ToolParam(param.name, "argument", keyword))
        fields.append(_field(param, hint, documented.get(param.name), where))
    if not fields:
        return None, tuple(params)
    if len(fields) == 1 and _is_struct(hints[fields[0][0]]):  # the one-Struct form
        params = [
            dataclasses.replace(p, role="input") if p.role == "argument" else p for p in params
        ]
        return hints[fields[0][0]], tuple(params)
    if unknown := sorted(set(documented) - {param.name for param in signature}):
        raise ConfigError(  # a parameter renamed, its description left behind
            f"tool {tool_name!r}: the docstring's Args: section names {unknown[0]!r},"
            " which is not one of its parameters"
        )
    arguments = msgspec.defstruct(
        "".join(part.capitalize() for part in tool_name.split("_")) + "Arguments",
        fields,
        kw_only=True,  # the signature's order, defaults or not
        forbid_unknown_fields=True,  # a misspelt argument fails, it does not take a default
        module=func.__module__,
    )
    return arguments, tuple(params)


def _field(param: inspect.Parameter, hint: Any, doc: str | None, where: str) -> tuple[Any, ...]:
    """``param`` as a ``msgspec.defstruct`` field: its name, type and default."""
    if doc and not _has_description(hint):
        hint = Annotated[hint, msgspec.Meta(description=doc)]
    default = param.default
    if default is not param.empty and _shared_if_mutable(default):
        # msgspec refuses a default every call would share: each call gets a copy, and
        # the schema still says what it is.
        shown = msgspec.Meta(extra_json_schema={"default": msgspec.to_builtins(default)})
        hint = Annotated[hint, shown]
        default = msgspec.field(default_factory=functools.partial(copy.deepcopy, default))
    try:
        msgspec.json.schema(hint)
    except (TypeError, ValueError) as exc:
        reason = (str(exc).strip().splitlines() or [repr(hint)])[-1]  # the line naming it
        raise ConfigError(f"{where}: its type has no JSON Schema ({reason})") from exc
    return (param.name, hint) if default is param.empty else (param.name, hint, default)


def _has_description(hint: Any) -> bool:
    return get_origin(hint) is Annotated and any(
        isinstance(meta, msgspec.Meta) and meta.description for meta in get_args(hint)[1:]
    )


def _shared_if_mutable(default: Any) -> bool:
    if isinstance(default, list | dict | set | bytearray):
        return bool(default)
    return isinstance(default, msgspec.Struct) and not default.__struct_config__.frozen


_ARGS_SECTION = re.compile(r"^( *)(?:Args|Arguments|Parameters|Keyword Args):\s*$")
_ARGS_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A Google-style docstring without its ``Args:`` section, and that section's
    description of each parameter (continuation lines joined)."""
    kept: list[str] = []
    documented: dict[str, str] = {}
    lines = iter(doc.splitlines())
    for line in lines:
        section = _ARGS_SECTION.match(line)
        if section is None:
            kept.append(line)
            continue
        indent, entry_indent, current = len(section.group(1)), None, None
        for line in lines:
            depth = len(line) - len(line.lstrip())
            if line.strip() and depth <= indent:  # the next section
                kept.append(line)
                break
            if not line.strip():
                continue
            entry_indent = entry_indent or depth
            entry = _ARGS_ENTRY.match(line.strip()) if depth == entry_indent else None
            if entry is not None:
                current = entry.group(1)
                documented[current] = entry.group(2).strip()
            elif current is not None:
                documented[current] = f"{documented[current]} {line.strip()}".strip()
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip(), documented


class PythonTools:
    """An agent's ``@tool`` functions as a ``gateway.tools.base.ToolBackend``.

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

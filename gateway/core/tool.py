"""Tool definitions and their registry: what a tool is, whoever runs it.

A tool is described by a ``ToolDef`` (what the model and the client see): a server
tool written in Python (``gateway.core.tool.python``, which runs it on the event loop) or
a client function. This module is part of the pure core: it checks definitions and
compiles their schemas, and never runs anything.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from gateway.core.inbound import Widget
from gateway.core.schema_guard import SchemaBudget, SchemaGuard
from gateway.core.widget import output_schema, widget_problem
from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.core.schema import SchemaValidator

__all__ = [
    "Delivery",
    "Execution",
    "Kind",
    "ToolDef",
    "ToolEntry",
    "ToolRegistry",
    "check_tool",
    "default_display_name",
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
    read_only: bool | None = None
    """The tool only reads (an MCP server's ``readOnlyHint``, an HTTP GET); ``None`` when
    nobody said. Kept for confirmation rules."""
    scopes: tuple[str, ...] = ()
    """Scopes the session's user must all have (from their client token) for a call to
    run; without them it fails with the code ``forbidden``."""
    confirm: bool = False
    """A call runs only once the user approved it (``tool.confirm``), or a rule did."""
    confirm_prompt: str | None = None
    """The sentence the user is asked, with ``{arg}`` placeholders (``gateway.core.confirm``)."""
    confirm_rule: str | None = None
    """A rule that may decide without asking: ``module:function`` or ``file.py:function``
    (resolved with the agent file, ``Agent.confirm_rules``)."""
    widget: Widget | None = None
    """A client function answered by the user through this widget (``gateway.core.widget``)."""
    ends_session: bool = False
    """The system tool ``end_session``: once it completes, the session ends after the
    response (``session.ended``)."""
    transfers: bool = False
    """The system tool ``transfer_to_agent``: once it completes, the session goes on with
    the agent named in its ``agent`` argument (``agent.transferred``)."""


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """A checked definition with its compiled schemas."""

    definition: ToolDef
    input_validator: SchemaValidator
    output_validator: SchemaValidator | None


def _compile(schema: dict[str, Any]) -> SchemaValidator | str:
    """Trusted schemas (the agent's own tools): checked in full, with no limits."""
    # Here, not at the top: jsonschema loads at the first check, not with the core.
    from gateway.core.schema import SchemaValidator, schema_problem

    problem = schema_problem(schema)
    return problem if problem is not None else SchemaValidator(schema)


def check_tool(
    definition: ToolDef,
    compile_schema: Callable[[dict[str, Any]], SchemaValidator | str] = _compile,
) -> ToolEntry:
    """``definition`` checked, with its schemas compiled by ``compile_schema``.

    Raises:
        ConfigError: a bad name, an empty description, a bad timeout or schema.
    """
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
    if definition.widget is not None:
        if definition.kind != "client":
            raise ConfigError(f"tool {name!r}: only a client function may have a widget")
        if problem := widget_problem(definition.widget, definition.input_schema):
            raise ConfigError(f"tool {name!r}: widget: {problem}")
        if validators[1] is None:  # the user's answer is checked like any result
            compiled = compile_schema(output_schema(definition.widget))
            assert not isinstance(compiled, str)
            validators[1] = compiled
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
            self._add(check_tool(definition))

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
            registry._add(check_tool(definition, compile_schema))
        return registry

    def definitions(self) -> list[ToolDef]:
        """Every definition, in the order they were added."""
        return [entry.definition for entry in self._entries.values()]

    def __iter__(self) -> Iterator[ToolEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

"""The Python tool API (issue 29): ``@tool`` bare or called, tools with plain typed parameters
whose input schema comes from the signature and whose arguments msgspec checks as it checks
a Struct tool's, and ``from gateway import tool, ...`` without loading the shell."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import msgspec
import pytest

from gateway.agent.file import Agent, load_agent
from gateway.agent.workbench import run_tool_alone
from gateway.errors import ConfigError
from gateway.tools.backend import NOBODY
from gateway.tools.python import Caller, Progress, ServerTool, tool
from gateway.wire.v1 import ResponseDone, ToolStatus
from tests.data import plain_tools
from tests.support import say, serving, session, streamed_text

ROOT = Path(__file__).parents[1]


def schema_of(func: Any) -> dict[str, Any]:
    return tool(func).definition.input_schema


# ------------------------------------------------------------------ schemas, kind by kind


def scalars(name: str, count: int = 3, ratio: float = 0.5, loud: bool = False) -> None:
    """Scalars: required without a default."""


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


def choices(unit: Literal["c", "f"], colour: Colour = Colour.GREEN) -> None:
    """Literal and Enum."""


def annotated(
    query: Annotated[str, msgspec.Meta(description="What to look for.", min_length=1)],
    limit: Annotated[int, msgspec.Meta(ge=1, le=50)] = 10,
) -> None:
    """Annotated with msgspec.Meta."""


def documented(
    city: str,
    unit: str = "c",
    days: int = 1,
    note: Annotated[str, msgspec.Meta(description="From Meta.")] = "",
) -> None:
    """Tell the weather.

    More words for the model.

    Args:
        city: The city,
            e.g. Paris.
        unit (str, optional): Celsius or Fahrenheit.
        days:
            How many days ahead.
        note: From the docstring (Meta wins).

    Returns:
        The weather.
    """


class Address(msgspec.Struct):
    """A postal address."""

    street: str
    zip_code: str | None = None


def nested(to: Address, via: list[Address] = []) -> None:  # noqa: B006 (each call gets a copy)
    """Structs, nested."""


class Options(TypedDict):
    verbose: bool
    depth: NotRequired[int]


def typed_dict(options: Options) -> None:
    """A TypedDict."""


def collections(
    tags: list[str],
    scores: dict[str, float],
    point: tuple[int, int],
    ids: set[int] = {1},  # noqa: B006 (each call gets a copy)
) -> None:
    """Lists, dicts, tuples, sets; a non-empty default is copied for each call."""


def optionals(nickname: str | None, age: int | None = None) -> None:
    """Optional with and without a default."""


def injected(progress: Progress, city: str, caller: Caller, *, unit: str = "c") -> None:
    """Progress and Caller are injected, not arguments; unit is keyword-only."""


SNAPSHOTS: list[tuple[Any, dict[str, Any]]] = [
    (
        scalars,
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "count": {"type": "integer", "default": 3},
                "ratio": {"type": "number", "default": 0.5},
                "loud": {"type": "boolean", "default": False},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    ),
    (
        choices,
        {
            "type": "object",
            "properties": {
                "unit": {"enum": ["c", "f"]},
                "colour": {"$ref": "#/$defs/Colour", "default": "green"},
            },
            "required": ["unit"],
            "additionalProperties": False,
            "$defs": {"Colour": {"title": "Colour", "enum": ["green", "red"]}},
        },
    ),
    (
        annotated,
        {
            "type": "object",
            "properties": {
                "query": {"description": "What to look for.", "type": "string", "minLength": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    (
        documented,
        {
            "type": "object",
            "properties": {
                "city": {"description": "The city, e.g. Paris.", "type": "string"},
                "unit": {
                    "description": "Celsius or Fahrenheit.",
                    "type": "string",
                    "default": "c",
                },
                "days": {
                    "description": "How many days ahead.",
                    "type": "integer",
                    "default": 1,
                },
                "note": {"description": "From Meta.", "type": "string", "default": ""},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    ),
    (
        nested,
        {
            "type": "object",
            "properties": {
                "to": {"$ref": "#/$defs/Address"},
                "via": {
                    "type": "array",
                    "items": {"$ref": "#/$defs/Address"},
                    "default": [],
                },
            },
            "required": ["to"],
            "additionalProperties": False,
            "$defs": {
                "Address": {
                    "title": "Address",
                    "description": "A postal address.",
                    "type": "object",
                    "properties": {
                        "street": {"type": "string"},
                        "zip_code": {
                            "anyOf": [{"type": "string"}, {"type": "null"}],
                            "default": None,
                        },
                    },
                    "required": ["street"],
                }
            },
        },
    ),
    (
        typed_dict,
        {
            "type": "object",
            "properties": {"options": {"$ref": "#/$defs/Options"}},
            "required": ["options"],
            "additionalProperties": False,
            "$defs": {
                "Options": {
                    "title": "Options",
                    "type": "object",
                    "properties": {"depth": {"type": "integer"}, "verbose": {"type": "boolean"}},
                    "required": ["verbose"],
                }
            },
        },
    ),
    (
        collections,
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "object", "additionalProperties": {"type": "number"}},
                "point": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 2,
                    "prefixItems": [{"type": "integer"}, {"type": "integer"}],
                    "items": False,
                },
                "ids": {
                    "default": [1],
                    "type": "array",
                    "items": {"type": "integer"},
                    "uniqueItems": True,
                },
            },
            "required": ["tags", "scores", "point"],
            "additionalProperties": False,
        },
    ),
    (
        optionals,
        {
            "type": "object",
            "properties": {
                "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            },
            "required": ["nickname"],
            "additionalProperties": False,
        },
    ),
    (
        injected,
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "default": "c"},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    ),
]


@pytest.mark.parametrize(("func", "expected"), SNAPSHOTS, ids=[f.__name__ for f, _ in SNAPSHOTS])
def test_the_input_schema_comes_from_the_signature(func: Any, expected: dict[str, Any]):
    assert schema_of(func) == expected


def test_the_description_is_the_docstring_without_its_args_section():
    assert tool(documented).definition.description == (
        "Tell the weather.\n\nMore words for the model.\n\nReturns:\n    The weather."
    )
    assert tool(description="Given.")(documented).definition.description == "Given."
    # ... and the descriptions still come from the docstring.
    assert (
        "description"
        in tool(description="Given.")(documented).definition.input_schema["properties"]["city"]
    )


# ------------------------------------------------------------------ @tool bare or called


def test_bare_and_called_decorators_make_the_same_tool():
    assert tool(scalars).definition == tool()(scalars).definition
    assert isinstance(plain_tools.get_weather, ServerTool)
    assert isinstance(plain_tools.add_struct, ServerTool)  # bare, on the one-Struct form

    @tool
    async def ping() -> None:
        """Answer pong."""

    assert ping.definition.input_schema == {"type": "object", "properties": {}}
    with pytest.raises(TypeError, match="keyword arguments only"):
        tool("ping")  # type: ignore[call-overload]


def test_the_one_struct_form_is_unchanged():
    made = plain_tools.add_struct.definition
    assert made.input_schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    assert made.description == "Add two integers (one Struct)."
    assert made.output_schema == {
        "type": "object",
        "properties": {"total": {"type": "integer"}},
        "required": ["total"],
    }

    # Its docstring stays whole: the Args: section describes no argument the model sends.
    assert "Args:" in tool(lookup).definition.description


class Query(msgspec.Struct):
    q: str


def lookup(query: Query) -> None:
    """Look up.

    Args:
        query: what the model sends.
    """


# ------------------------------------------------------------------ mistakes at startup


class Opaque:
    """msgspec has no schema for it."""


def with_args(*cities: str) -> None:
    """Takes *args."""


def with_kwargs(**cities: str) -> None:
    """Takes **kwargs."""


def untyped(city, unit: str = "c") -> None:  # type: ignore[no-untyped-def]
    """No annotation."""


def opaque(thing: Opaque, city: str) -> None:
    """A type msgspec cannot describe."""


def stale_docs(city: str, unit: str = "c") -> None:
    """Renamed parameter, docstring left behind.

    Args:
        town: The city.
    """


@pytest.mark.parametrize(
    ("func", "message"),
    [
        (with_args, "tool 'with_args': parameter 'cities': a tool's arguments are named"),
        (with_kwargs, "tool 'with_kwargs': parameter 'cities': a tool's arguments are named"),
        (untyped, "tool 'untyped': parameter 'city' has no type annotation"),
        (opaque, "tool 'opaque': parameter 'thing': its type has no JSON Schema (type <class"),
        (stale_docs, "tool 'stale_docs': the docstring's Args: section names 'town'"),
    ],
)
def test_a_signature_that_cannot_be_a_tool_is_a_startup_error(func: Any, message: str):
    with pytest.raises(ConfigError) as raised:
        tool(func)
    assert str(raised.value).startswith(message)


def test_type_hints_that_do_not_resolve_are_a_startup_error():
    class Local(msgspec.Struct):  # not a module-level name: the string hint cannot resolve
        x: int

    def uses_local(a: Local, b: int) -> None:
        """A hint naming a class defined inside a function."""

    with pytest.raises(ConfigError, match="'uses_local': cannot resolve its type hints: name"):
        tool(uses_local)


# ------------------------------------------------------------------ calls


async def test_plain_parameters_receive_converted_arguments_sync_or_async():
    seen: list[tuple[Any, ...]] = []

    @tool
    def sync_tool(to: Address, colour: Colour = Colour.RED, *, ids: set[int] = {1}) -> None:  # noqa: B006
        """Sync."""
        ids.add(len(seen) + 2)  # changes this call's copy only
        seen.append((to, colour, ids))

    @tool
    async def async_tool(progress: Progress, city: str, caller: Caller) -> dict[str, Any]:
        """Async, the injected parameters around the argument."""
        progress({"city": city})
        return {"city": city, "caller": caller.principal}

    await sync_tool.invoke({"to": {"street": "Main St"}, "colour": "green"})
    await sync_tool.invoke({"to": {"street": "Side St"}})
    assert seen == [
        (Address(street="Main St"), Colour.GREEN, {1, 2}),
        (Address(street="Side St"), Colour.RED, {1, 3}),
    ]
    reports: list[Any] = []
    result = await async_tool.invoke({"city": "Oslo"}, reports.append, NOBODY)
    assert result == {"city": "Oslo", "caller": "nobody"}
    assert reports == [{"city": "Oslo"}]


# ------------------------------------------------------------------ checked at the edge


def load(tmp_path: Path, *refs: str) -> Agent:
    (tmp_path / "scenario.toml").write_text('pace = 0\nfallback = "hi"\n')
    tools = "".join(f'[[server_tools]]\nref = "{ref}"\n' for ref in refs)
    agent = tmp_path / "agent.toml"
    agent.write_text(
        f'name = "plain"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n{tools}'
    )
    return load_agent(agent)


async def test_arguments_are_checked_as_a_struct_tools_are(tmp_path: Path):
    agent = load(tmp_path, "tests.data.plain_tools:add_plain", "tests.data.plain_tools:add_struct")
    bodies = [
        {"a": 1},  # missing
        {"a": "one", "b": 2},  # wrong type
        {"a": 1, "b": -1},  # out of range
        {"a": 1, "b": 2, "c": 3},  # unknown
        [1, 2],  # not an object
    ]
    answers = []
    for body in bodies:
        plain = await run_tool_alone(agent, "add_plain", json.dumps(body).encode(), 5.0)
        struct = await run_tool_alone(agent, "add_struct", json.dumps(body).encode(), 5.0)
        assert plain == struct, body
        answers.append(plain)
    assert answers == [
        (422, {"error": "invalid input: value: 'b' is a required property"}),
        (422, {"error": "invalid input: ['a']: 'one' is not of type 'integer'"}),
        (422, {"error": "invalid input: ['b']: -1 is less than the minimum of 0"}),
        (422, {"error": "invalid input: value: Additional properties are not allowed ('c')"}),
        (422, {"error": "invalid input: value: [1, 2] is not of type 'object'"}),
    ]
    status, ran = await run_tool_alone(agent, "add_plain", b'{"a": 40, "b": 2}', 5.0)
    assert (status, ran["output"]) == (200, {"total": 42})


# ------------------------------------------------------------------ from gateway import ...


def test_the_tool_authors_names_import_from_gateway_lazily():
    script = textwrap.dedent(
        """
        import json, sys
        import gateway
        after_import = sorted(m for m in sys.modules if m.startswith("gateway."))
        from gateway import Approve, Caller, Deny, Progress, ToolForbidden, tool
        import gateway.confirm, gateway.errors, gateway.server_tool, gateway.tools.backend
        import gateway.tools
        homes = [
            tool is gateway.server_tool.tool,
            Progress is gateway.server_tool.Progress,
            Caller is gateway.tools.backend.Caller,
            ToolForbidden is gateway.errors.ToolForbidden,
            Approve is gateway.confirm.Approve,
            Deny is gateway.confirm.Deny,
            gateway.tools.Progress is Progress,
        ]
        try:
            from gateway import nothing_of_the_sort
        except ImportError:
            missing = "ImportError"
        shell = ("starlette", "httpx", "uvicorn", "redis")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in shell)
        print(json.dumps([after_import, homes, missing, loaded]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    after_import, homes, missing, loaded = json.loads(done.stdout)
    assert after_import == []  # nothing behind the names until one is asked for
    assert homes == [True] * 7
    assert missing == "ImportError"
    assert loaded == []


# ------------------------------------------------------------------ end to end

SCENARIO = """
pace = 0
fallback = "Ask me about the weather."

[[rules]]
match = 'weather in (?P<city>[A-Za-z]+)(?: in (?P<unit>\\w+))?$'
calls = [{ tool = "get_weather", args = { city = "{city}", unit = "{unit}" } }]

[[rules]]
match = 'ship (?P<item>\\w+) and (?P<other>\\w+) to (?P<street>.+)$'
[[rules.calls]]
tool = "ship"
args = { address = { street = "{street}" }, items = ["{item}", "{other}"] }

[[rules]]
match = 'ship nothing'
calls = [{ tool = "ship", args = { address = { street = "x" }, items = [] } }]

[[results]]
tool = "get_weather"
say = "{output.temp} degrees {output.unit} in {output.city}."
on_error = "No weather: {error}"

[[results]]
tool = "ship"
when = "pending"
say = "Shipping."
on_error = "Not shipped: {error}"

[[completions]]
tool = "ship"
say = "Shipped to {output.to}."
"""


async def test_a_plain_parameter_tool_runs_end_to_end(tmp_path: Path):
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'name = "plain"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
        '[[server_tools]]\nref = "tests.data.plain_tools:get_weather"\n'
        '[[server_tools]]\nref = "tests.data.plain_tools:ship"\n'
    )
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, _):
        events = await say(conn, "weather in Paris")  # the default unit
        assert streamed_text(events) == "21.0 degrees c in Paris."
        offered = {t.name: t for t in gateway.model.requests[0].tools}  # what the model saw
        assert offered["get_weather"].input_schema == {
            "type": "object",
            "properties": {
                "city": {"description": "The city, e.g. Paris.", "type": "string"},
                "unit": {
                    "description": "Celsius or Fahrenheit.",
                    "enum": ["c", "f"],
                    "default": "c",
                },
            },
            "required": ["city"],
            "additionalProperties": False,
        }
        assert offered["get_weather"].description == "Tell the weather in a city."
        assert set(offered["ship"].input_schema["properties"]) == {"address", "items"}

        events = await say(conn, "weather in Paris in f")
        assert streamed_text(events) == "69.8 degrees f in Paris."
        events = await say(conn, "weather in Paris in kelvin")  # refused before it runs
        failed = [e for e in events if isinstance(e, ToolStatus)]
        assert [e.status for e in failed] == ["failed"]
        assert failed[0].error == "invalid arguments: ['unit']: 'kelvin' is not one of ['c', 'f']"
        assert streamed_text(events) == f"No weather: {failed[0].error}"

        # Async, a nested Struct and a list; Progress and Caller injected.
        events = await say(conn, "ship tea and cups to 1 Main St")
        events += await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        statuses = [e for e in events if isinstance(e, ToolStatus)]
        assert [e.status for e in statuses] == ["pending", "progress", "progress", "completed"]
        assert [e.progress for e in statuses[1:3]] == [{"packed": "tea"}, {"packed": "cups"}]
        assert statuses[-1].result == {
            "to": "1 Main St",
            "items": ["tea", "cups"],
            "sender": "anonymous",
        }
        assert streamed_text(events) == "Shipping.Shipped to 1 Main St."

        events = await say(conn, "ship nothing")
        failed = [e for e in events if isinstance(e, ToolStatus)]
        assert failed[-1].error == "invalid arguments: ['items']: [] should be non-empty"

"""Agent files: the demo loads; every bad file fails at startup with file, tool and reason."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway.agent.file import DEMO_AGENT, load_agent
from gateway.errors import ConfigError
from gateway.providers.base import Capabilities
from gateway.tools.python import tool

SCENARIO = "pace = 0\n"
OPEN = '[[client_functions]]\nname = "open"\ndescription = "d"\n'
TOOLS_PY = '''
import msgspec
from gateway.tools.python import tool

class Query(msgspec.Struct):
    q: str

class Answer(msgspec.Struct):
    a: str

@tool(timeout=1)
def lookup(query: Query) -> Answer:
    """Look something up."""
    return Answer(a=query.q)

@tool(name="lookup")
def another_lookup(query: Query) -> Answer:
    """Look something else up."""
    return Answer(a="other")

not_a_tool = 3
'''


def write_agent(tmp_path: Path, body: str) -> Path:
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    path = tmp_path / "agent.toml"
    header = 'name = "a"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
    path.write_text(header + textwrap.dedent(body))
    return path


def test_demo_agent_has_the_promised_tools():
    agent = load_agent(DEMO_AGENT)
    kinds = {d.name: d.kind for d in agent.tools.definitions()}
    assert kinds == {
        "check_stock": "server",
        "check_order_status": "server",
        "cancel_order": "server",
        "open_settings": "client",
        "get_battery_level": "client",
        "get_nearest_store": "client",
        "choose_pickup_store": "client",
        "transfer_to_agent": "server",
    }
    order = agent.tools.get("check_order_status")
    assert order is not None
    assert (order.definition.execution, order.definition.delivery) == ("async", "when_idle")
    schema = agent.tools.get("check_stock").definition.input_schema  # type: ignore[union-attr]
    assert schema["required"] == ["product"]
    assert schema["properties"]["product"]["type"] == "string"


def test_server_tool_from_a_file_next_to_the_agent(tmp_path: Path):
    path = write_agent(tmp_path, '[[server_tools]]\nref = "my_tools.py:lookup"\ntimeout = 3\n')
    agent = load_agent(path)
    lookup = agent.tools.get("lookup")
    assert lookup is not None
    assert lookup.definition.timeout == 3
    assert lookup.definition.output_schema is not None
    assert agent.toolbox.backend_of("lookup") is agent.toolbox.backends[0]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            '[[client_functions]]\nname = "OpenSettings"\ndescription = "x"\n',
            ["'OpenSettings'", "snake_case"],
        ),
        ('[[client_functions]]\nname = "open"\ndescription = "  "\n', ["'open'", "description"]),
        ('[[client_functions]]\nname = "open"\n', ["description"]),
        (f'{OPEN}input_schema = {{ type = "array" }}\n', ["'open'", "type 'object'"]),
        (
            f"{OPEN}output_schema = {{ type = 5 }}\n",
            ["'open'", "output_schema", "invalid JSON Schema"],
        ),
        (f"{OPEN}timeout = -1\n", ["'open'", "timeout"]),
        (OPEN + OPEN, ["'open'", "defined twice"]),
        ('[[server_tools]]\nref = "my_tools.py:not_a_tool"\n', ["not_a_tool", "@tool"]),
        ('[[server_tools]]\nref = "my_tools.py:missing"\n', ["missing"]),
        ('[[server_tools]]\nref = "no_such_module_xyz:thing"\n', ["cannot import"]),
        ('[[server_tools]]\nref = "nocolon"\n', ["module:name"]),
        ("surprise = 1\n", ["surprise"]),
    ],
)
def test_bad_agent_files_fail_with_file_tool_and_reason(tmp_path: Path, body, words):
    path = write_agent(tmp_path, body)
    with pytest.raises(ConfigError) as raised:
        load_agent(path)
    message = str(raised.value)
    assert str(path) in message
    for word in words:
        assert word in message


def test_unknown_provider_is_a_config_error(tmp_path: Path):
    path = tmp_path / "agent.toml"
    path.write_text('name = "a"\n[model]\nprovider = "telepathy"\n')
    with pytest.raises(ConfigError, match="unknown provider 'telepathy'"):
        load_agent(path)


def test_tools_given_to_a_model_without_tool_support_fail_at_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = write_agent(tmp_path, '[[client_functions]]\nname = "open"\ndescription = "d"\n')
    from gateway.providers.scripted import ScriptedProvider

    monkeypatch.setattr(ScriptedProvider, "capabilities", Capabilities(tools=False))
    with pytest.raises(ConfigError, match="cannot call tools, but the agent has: open"):
        load_agent(path)


def test_tool_decorator_rejects_a_function_without_a_description():
    # Plain typed parameters are tools' inputs too: tests/test_tool_signatures.py.
    def undocumented() -> None: ...

    with pytest.raises(ConfigError, match="description"):
        tool()(undocumented)


def test_a_tool_parameter_without_annotation_is_a_startup_error_naming_it():
    def untyped(query):  # type: ignore[no-untyped-def]
        """Look something up."""

    with pytest.raises(ConfigError, match="tool 'untyped': parameter 'query' has no type"):
        tool()(untyped)


def test_two_tools_with_one_name_are_a_startup_error(tmp_path: Path):
    path = write_agent(
        tmp_path,
        '[[server_tools]]\nref = "my_tools.py:lookup"\n'
        '[[server_tools]]\nref = "my_tools.py:another_lookup"\n',
    )
    with pytest.raises(ConfigError, match="tool 'lookup': defined twice") as raised:
        load_agent(path)
    assert "another_lookup" in str(raised.value)


async def test_server_tool_invoke_converts_input_and_output(tmp_path: Path):
    agent = load_agent(write_agent(tmp_path, '[[server_tools]]\nref = "my_tools.py:lookup"\n'))
    assert await agent.toolbox.call("lookup", {"q": "hi"}, lambda _: None) == {"a": "hi"}


def test_an_http_model_without_tools_refuses_an_agent_with_tools(tmp_path: Path):
    path = tmp_path / "agent.toml"
    path.write_text(
        'name = "a"\n[model]\nprovider = "openai"\nmodel = "tiny"\ntools = false\n'
        '[[client_functions]]\nname = "open"\ndescription = "d"\n'
    )
    with pytest.raises(ConfigError, match="'openai' cannot call tools, but the agent has: open"):
        load_agent(path)


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("openai", "provider:model"),
        ("teleport:x", "unknown provider"),
        ("openai:", "provider:model"),
    ],
)
def test_model_flag_is_checked(model, words):
    with pytest.raises(ConfigError, match=words):
        load_agent(DEMO_AGENT, model=model)


def test_model_flag_puts_the_demo_on_an_http_model():
    agent = load_agent(DEMO_AGENT, model="openai:gpt-test", base_url="http://127.0.0.1:9/v1")
    assert agent.provider.name == "openai"
    assert agent.provider.settings.base_url == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]
    assert agent.provider.settings.model == "gpt-test"  # type: ignore[attr-defined]

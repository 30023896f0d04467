"""The system tool transfer_to_agent: the conversation goes on with another agent file, its
history kept, with that agent's instructions, model and tools; the client is told
(agent.transferred), and a session restored elsewhere goes on with the agent it was with."""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from pathlib import Path

import httpx
import msgspec
import pytest

from client_sdk import connect
from gateway.agent.file import load_agent, load_crew
from gateway.core.event import RunTool, ToolFinished
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.session import AgentProfile, Session
from gateway.core.state import decode_state, encode_state
from gateway.core.tool import ToolDef, ToolRegistry
from gateway.core.transcript import AssistantTurn, UserTurn
from gateway.errors import ConfigError
from gateway.tools.system import TransferTarget, transfer_tool
from gateway.wire.v1 import (
    AgentTransferred,
    ResponseDone,
    SessionResumed,
    SessionStart,
    ToolSpec,
    ToolStatus,
    UserMessage,
)
from tests.redis_server import RedisServer
from tests.support import serving
from tests.test_cluster import client_on, moved_to, said, text_of
from tests.test_session import Harness, persisted  # noqa: F401
from tests.test_tool_choice_e2e import run_js

# ----------------------------------------------------------------- the session core

REFUND = ToolDef(
    name="refund",
    description="Refund a charge.",
    kind="server",
    input_schema={"type": "object"},
)
BILLING = AgentProfile(
    agent="billing",
    instructions="Count the money.",
    tools=ToolRegistry([REFUND]),
)
FLASHLIGHT = ToolSpec(
    name="flashlight", description="Switch the flashlight.", input_schema={"type": "object"}
)


def front_desk(**profiles: AgentProfile) -> Harness:
    """A harness whose agent ("test") may hand sessions to ``profiles``."""
    h = Harness()
    h.settings = dataclasses.replace(
        h.settings,
        tools=h.settings.tools.extended([transfer_tool([TransferTarget("billing", "Money.")])]),
        agents=profiles.get,
    )
    h.session = Session(h.settings, session_id="sess_1", resume_token="t", new_id=h.new_id)
    return h


def ask_for_transfer(h: Harness) -> list[object]:
    """The model of the front desk hands the user to billing; what the session sent."""
    h.feed(UserMessage(text="my bill is wrong"))
    h.model(
        ModelText("Let me pass you to billing."),
        ModelToolCall(name="transfer_to_agent", args={"agent": "billing", "reason": "a bill"}),
        ModelFinish(),
    )
    run = [e for e in h.other if isinstance(e, RunTool)][-1]
    assert (run.tool, run.agent) == ("transfer_to_agent", "test")
    return list(h.feed(ToolFinished(call_id=run.call_id, output={"agent": "billing"})))


def test_the_next_step_is_the_new_agents_with_the_history_and_the_clients_additions():
    h = front_desk(billing=BILLING)
    h.start(instructions="Answer in French.", client_functions=[FLASHLIGHT])
    sent = ask_for_transfer(h)
    completed, transferred = [m for m in sent if isinstance(m, ToolStatus | AgentTransferred)]
    assert isinstance(completed, ToolStatus)
    assert completed.status == "completed"
    assert isinstance(transferred, AgentTransferred)
    assert (transferred.agent, transferred.previous_agent, transferred.reason) == (
        "billing",
        "test",
        "a bill",
    )
    assert [t.name for t in transferred.tools] == ["refund", "flashlight"]
    step = h.last_model_call()
    assert step.agent == "billing"
    assert step.request.instructions == "Count the money.\n\nAnswer in French."
    assert [t.name for t in step.request.tools] == ["refund", "flashlight"]
    assert step.request.items[0] == UserTurn(text="my bill is wrong")
    assert isinstance(step.request.items[1], AssistantTurn)  # the history is kept
    assert h.session.agent == "billing"
    h.model(ModelToolCall(name="refund", args={}), ModelFinish())
    run = [e for e in h.other if isinstance(e, RunTool)][-1]
    assert (run.tool, run.agent) == ("refund", "billing")  # the new agent's tool runs


def test_a_transfer_that_cannot_be_fails_the_call_and_the_agent_stays():
    h = front_desk()  # billing is not an agent this gateway has
    h.start()
    sent = ask_for_transfer(h)
    assert not [m for m in sent if isinstance(m, AgentTransferred)]
    (failed,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert (failed.status, failed.error) == ("failed", "no agent 'billing' to go to")
    assert h.last_model_call().agent == "test"
    assert h.session.agent == "test"


def test_a_client_function_clashing_with_the_new_agents_tools_keeps_the_agent():
    h = front_desk(billing=BILLING)
    h.start(client_functions=[msgspec.structs.replace(FLASHLIGHT, name="refund")])
    sent = ask_for_transfer(h)
    (failed,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.startswith("cannot transfer: ")
    assert "refund" in failed.error
    assert h.session.agent == "test"
    assert [t.name for t in h.last_model_call().request.tools][-1] == "refund"


def test_a_transferred_session_restored_where_its_agent_is_missing_is_refused():
    h = front_desk(billing=BILLING)
    h.start()
    ask_for_transfer(h)
    state = decode_state(encode_state(h.session.state()))
    assert state.agent == "billing"
    nowhere = dataclasses.replace(h.settings, agents=lambda _: None)
    with pytest.raises(ConfigError, match="billing"):
        Session.restore(nowhere, state, new_id=h.new_id)


def test_session_start_sees_only_the_gateways_own_agent():
    h = front_desk(billing=BILLING)
    (error,) = h.feed(SessionStart(agent="billing"))
    assert "unknown agent" in error.message  # type: ignore[attr-defined]


# ----------------------------------------------------------------- agent files

FRONT_SCENARIO = """
pace = 0
fallback = "Front desk: no rule for that."
[[rules]]
match = "bill"
say = "Let me pass you to billing."
calls = [{ tool = "transfer_to_agent", args = { agent = "billing", reason = "about a bill" } }]
[[rules]]
match = "who"
say = "The front desk."
[[results]]
tool = "transfer_to_agent"
say = "Front desk again."
"""

BILLING_SCENARIO = """
pace = 0
fallback = "Billing: no rule for that."
[[rules]]
match = "who"
say = "Billing speaking."
[[rules]]
match = "time"
calls = [{ tool = "get_current_time" }]
[[rules]]
match = "back"
calls = [{ tool = "transfer_to_agent", args = { agent = "front" } }]
[[results]]
tool = "transfer_to_agent"
say = "Billing here."
[[results]]
tool = "get_current_time"
say = "Billing says it is {output.time}."
"""


def write_agents(tmp_path: Path) -> Path:
    """Two agents that hand the conversation to each other; the front desk's file."""
    (tmp_path / "front_scenario.toml").write_text(FRONT_SCENARIO)
    (tmp_path / "billing_scenario.toml").write_text(BILLING_SCENARIO)
    (tmp_path / "front.toml").write_text(
        textwrap.dedent(
            """
            name = "front"
            instructions = "Welcome people."
            system_tools = ["transfer_to_agent"]
            [model]
            provider = "scripted"
            scenario = "front_scenario.toml"
            [[transfers]]
            file = "billing.toml"
            description = "Invoices, charges and refunds."
            """
        )
    )
    (tmp_path / "billing.toml").write_text(
        textwrap.dedent(
            """
            name = "billing"
            instructions = "Count the money."
            system_tools = ["transfer_to_agent", "get_current_time"]
            [model]
            provider = "scripted"
            scenario = "billing_scenario.toml"
            [[transfers]]
            file = "front.toml"
            description = "Everything that is not about money."
            """
        )
    )
    return tmp_path / "front.toml"


def test_agents_that_hand_over_to_each_other_are_each_loaded_once(tmp_path: Path):
    front = load_agent(write_agents(tmp_path))
    crew = load_crew(front)
    assert list(crew) == ["front", "billing"]
    assert crew["front"] is front
    assert crew["billing"].transfers == {"front": (tmp_path / "front.toml").resolve()}
    (tool,) = [d for d in front.tools.definitions() if d.name == "transfer_to_agent"]
    assert tool.input_schema["properties"]["agent"]["enum"] == ["billing"]
    assert "- billing: Invoices, charges and refunds." in tool.description


@pytest.mark.parametrize(
    ("top", "transfers", "error"),
    [
        ('system_tools = ["transfer_to_agent"]', "", "go together"),
        ("", '[[transfers]]\nfile = "billing.toml"\ndescription = "Money."', "go together"),
        (
            'system_tools = ["transfer_to_agent"]',
            '[[transfers]]\nfile = "front.toml"\ndescription = "Me."',
            "is this agent",
        ),
        (
            'system_tools = ["transfer_to_agent"]',
            '[[transfers]]\nfile = "nowhere.toml"\ndescription = "Lost."',
            "cannot read",
        ),
    ],
)
def test_a_transfer_badly_declared_is_a_startup_error(
    tmp_path: Path, top: str, transfers: str, error: str
):
    write_agents(tmp_path)
    (tmp_path / "front.toml").write_text(
        f'name = "front"\n{top}\n[model]\nprovider = "scripted"\n'
        f'scenario = "front_scenario.toml"\n{transfers}\n'
    )
    with pytest.raises(ConfigError, match=error):
        load_crew(load_agent(tmp_path / "front.toml"))


def test_two_agent_files_of_one_name_are_a_startup_error(tmp_path: Path):
    write_agents(tmp_path)
    text = (tmp_path / "billing.toml").read_text()
    (tmp_path / "billing.toml").write_text(text.replace('file = "front.toml"', 'file = "f2.toml"'))
    (tmp_path / "f2.toml").write_text((tmp_path / "front.toml").read_text())
    with pytest.raises(ConfigError, match="the agent 'front' is"):
        load_crew(load_agent(tmp_path / "front.toml"))


# ----------------------------------------------------------------- over real sockets


async def test_the_python_sdk_talks_to_billing_then_back_to_the_front_desk(tmp_path: Path):
    async with serving(agent=str(write_agents(tmp_path))) as gateway, connect(gateway.url) as conv:
        created = await conv.start()
        assert (created.agent, conv.agent) == ("front", "front")
        events = conv.events()
        answer = "".join([d async for d in conv.say("my bill is wrong")])
        assert answer == "Let me pass you to billing. Billing here."
        assert conv.agent == "billing"
        async for event in events:
            if isinstance(event, AgentTransferred):
                break
        assert (event.previous_agent, event.reason) == ("front", "about a bill")
        assert {t.name for t in event.tools} == {"transfer_to_agent", "get_current_time"}
        time_answer = "".join([d async for d in conv.say("what time is it?")])
        assert time_answer.startswith("Billing says it is ")  # billing's own tool
        assert "".join([d async for d in conv.say("take me back")]) == "Front desk again."
        assert conv.agent == "front"
        assert "".join([d async for d in conv.say("who are you?")]) == "The front desk."


async def test_the_tools_of_an_agent_sessions_may_be_handed_to_are_listed_and_tested(
    tmp_path: Path,
):
    async with serving(agent=str(write_agents(tmp_path))) as gateway:
        base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
        async with httpx.AsyncClient(base_url=base) as http:
            listed = (await http.get("/v1/tools", params={"agent": "billing"})).json()
            assert listed["agent"] == "billing"
            assert {t["name"] for t in listed["tools"]} == {"transfer_to_agent", "get_current_time"}
            ran = await http.post(
                "/v1/tools/get_current_time/test", params={"agent": "billing"}, content=b"{}"
            )
            assert ran.status_code == 200
            assert ran.json()["output"]["time_zone"] == "UTC"
            front = await http.post("/v1/tools/get_current_time/test", content=b"{}")
            assert front.status_code == 404  # the front desk has no such tool
            unknown = await http.get("/v1/tools", params={"agent": "nobody"})
            assert (unknown.status_code, unknown.json()) == (
                404,
                {"error": "no agent 'nobody' on this gateway"},
            )


async def test_a_transferred_session_goes_on_with_its_agent_on_another_node(
    tmp_path: Path, redis: RedisServer
):
    agent = str(write_agents(tmp_path))
    async with (
        serving(agent=agent, store=redis.url, node_id="node-a", lease_ttl=1.0) as a,
        serving(agent=agent, store=redis.url, node_id="node-b", lease_ttl=1.0) as b,
        client_on(a) as client,
    ):
        assert text_of(await said(client, "my bill is wrong")).endswith("Billing here.")
        resumed = await moved_to(client, b)
        assert resumed.agent == "billing"
        assert isinstance(resumed, SessionResumed)
        assert client.conv.agent == "billing"
        assert text_of(await said(client, "who is this?")) == "Billing speaking."
        events = await said(client, "back please")
        assert [e.agent for e in events if isinstance(e, AgentTransferred)] == ["front"]
        assert text_of(events) == "Front desk again."
        assert client.conv.session is not None
        assert client.conv.session.session_id in b.runtime.drivers
        done = [e for e in events if isinstance(e, ResponseDone)]
        assert done[-1].status == "completed"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
async def test_the_js_sdk_follows_the_demo_to_its_billing_desk_and_back():
    result = await run_js(Path(__file__).parent / "js" / "live_transfer.mjs")
    assert result["idle"] is None
    assert (result["before"], result["during"], result["after"]) == ("demo", "billing", "demo")
    assert result["handedOver"] == (
        "Let me hand you over to our billing desk. Billing desk here: I can look up your last"
        " invoice or explain a refund. What do you need?"
    )
    assert result["invoice"] == "Your last invoice, INV-2041, was $39.00, paid on 2026-11-28."
    assert result["handedBack"] == (
        "I'll hand you back to the shop assistant. Shop assistant here again. What else can I"
        " do for you?"
    )
    to_billing, to_demo = result["transfers"]
    assert to_billing["previous"] == "demo"
    assert to_billing["reason"] == "a billing question"
    assert "get_last_invoice" in to_billing["tools"]
    assert "check_stock" not in to_billing["tools"]
    assert (to_demo["agent"], to_demo["reason"]) == ("demo", "not a billing question")
    assert "check_stock" in to_demo["tools"]

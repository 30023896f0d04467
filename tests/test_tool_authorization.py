"""A tool call runs on behalf of the session's user: the scopes of their client token are
checked against those a tool requires, their claims reach Python tools, and a tool may refuse
them (the demo's order lookup answers only for an order's own customer). Refusals reach the
model as a tool error and the client as ``tool.status failed`` with the code ``forbidden``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client_sdk import connect
from gateway.core.event import RunTool
from gateway.core.model import ModelFinish, ModelToolCall
from gateway.core.principal import Principal
from gateway.core.session import Session
from gateway.core.tool import ToolDef
from gateway.wire.v1 import ResponseDone, TextDelta, ToolStatus, UserMessage
from tests.support import Gateway, serving
from tests.test_session import Harness, persisted  # noqa: F401

KEY = "backend-key-0123456789abcdef"
AUTH: dict[str, Any] = {"no_auth": False, "api_keys": f"backend:{KEY}", "token_secret": "s" * 40}

TOOLS_PY = '''
import msgspec
from gateway.tools.python import Caller, tool


class Who(msgspec.Struct):
    user: str | None
    scopes: list[str]
    plan: str | None


@tool(scopes=("account:read",))
def my_account(caller: Caller) -> Who:
    """Tell who the signed-in user is."""
    return Who(user=caller.user_id, scopes=list(caller.scopes), plan=caller.claims.get("plan"))
'''

SCENARIO = """
pace = 0
fallback = "?"

[[rules]]
match = "my account"
calls = [{ tool = "my_account" }]

[[rules]]
match = 'order (?P<id>\\d+)'
calls = [{ tool = "check_order_status", args = { order_id = "{id}" } }]

[[results]]
tool = "my_account"
say = "You are {output.user} on the {output.plan} plan."
on_error = "Sorry: {error}"

[[results]]
tool = "check_order_status"
when = "pending"
say = "Looking."

[[completions]]
tool = "check_order_status"
say = "Order {output.order_id} is {output.status}."
on_error = "Sorry: {error}"
"""


def test_a_tool_needing_a_scope_the_user_lacks_fails_forbidden_without_running():
    lacking = Principal(name="key:b/user:7", kind="client_token", user_id="7", scopes=("x",))
    h = Harness(principal=lacking)
    secret = ToolDef(
        name="secret",
        description="Open the vault.",
        kind="server",
        input_schema={"type": "object"},
        scopes=("vault:open",),
    )
    h.settings = dataclasses.replace(h.settings, tools=h.settings.tools.extended([secret]))
    h.session = Session(h.settings, session_id="sess_1", resume_token="t", new_id=h.new_id)
    h.start()
    h.feed(UserMessage(text="open the vault"))
    sent = h.model(ModelToolCall(name="secret", args={}), ModelFinish())
    (status,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert (status.status, status.code) == ("failed", "forbidden")
    assert (
        status.error
        == "forbidden: tool 'secret' needs the scope 'vault:open', which '7' does not have"
    )
    assert not [e for e in h.other if isinstance(e, RunTool)]


@pytest.fixture
async def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "0")
    (tmp_path / "account_tools.py").write_text(TOOLS_PY)
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(
        textwrap.dedent(
            """
            name = "shop"
            [model]
            provider = "scripted"
            scenario = "scenario.toml"
            [[server_tools]]
            ref = "account_tools.py:my_account"
            [[server_tools]]
            ref = "gateway.demo.tools:check_order_status"
            """
        )
    )
    async with serving(agent=str(agent), **AUTH) as gateway:
        yield gateway


async def mint(gateway: Gateway, user: dict[str, Any]) -> str:
    base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
    async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
        answer = await client.post(
            "/v1/sessions", json={"user": user}, headers={"authorization": f"Bearer {KEY}"}
        )
    assert answer.status_code == 201, answer.text
    token: str = answer.json()["token"]
    return token


async def converse(
    gateway: Gateway, token: str, text: str, responses: int = 1
) -> tuple[list[str], list[ToolStatus]]:
    """Say ``text`` with the SDK; the text of each of the ``responses`` that follow (an
    async tool's completion starts one of its own) and the ``tool.status`` events seen."""
    answers: list[str] = []
    statuses: list[ToolStatus] = []
    async with connect(gateway.url, token=token) as conv:
        await conv.start()
        events = conv.events()
        await conv.post(text)
        current: list[str] = []
        async with asyncio.timeout(10):
            async for event in events:
                if isinstance(event, ToolStatus):
                    statuses.append(event)
                elif isinstance(event, TextDelta):
                    current.append(event.delta)
                elif isinstance(event, ResponseDone):
                    answers.append("".join(current))
                    current = []
                    if len(answers) == responses:
                        break
    return answers, statuses


async def test_the_users_claims_reach_the_tool_and_a_missing_scope_is_forbidden(shop: Gateway):
    allowed = await mint(shop, {"id": "ana", "scopes": ["account:read"], "plan": "gold"})
    answers, _ = await converse(shop, allowed, "my account")
    assert answers == ["You are ana on the gold plan."]

    lacking = await mint(shop, {"id": "ben", "scopes": ["orders:read"]})
    (answer,), statuses = await converse(shop, lacking, "my account")
    assert answer.startswith("Sorry: forbidden: tool 'my_account' needs the scope 'account:read'")
    assert [(s.status, s.code) for s in statuses] == [("failed", "forbidden")]


async def test_the_demo_order_lookup_answers_only_for_the_orders_own_customer(shop: Gateway):
    ana = await mint(shop, {"id": "ana"})
    answers, _ = await converse(shop, ana, "where is my order 5678", responses=2)
    assert answers[0] == "Looking."
    assert answers[1].startswith("Order 5678 is ")

    ben = await mint(shop, {"id": "ben"})
    answers, statuses = await converse(shop, ben, "where is order 5678", responses=2)
    assert answers == ["Looking.", "Sorry: order 5678 belongs to another customer"]
    assert [(s.status, s.code) for s in statuses] == [("pending", None), ("failed", "forbidden")]
    answers, _ = await converse(shop, ben, "and order 1234", responses=2)  # a guest order
    assert answers[1].startswith("Order 1234 is ")

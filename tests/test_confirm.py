"""Confirmation of tool calls in the pure session core: asked, approved (maybe with edited
arguments), declined, decided by a rule, expired; kept across a persist/restore (every test
runs both ways, see tests/test_session.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.core.confirm import Approve, ConfirmRequest, Deny
from gateway.core.event import RunTool, Tick, ToolFinished
from gateway.core.model import ModelFinish, ModelToolCall
from gateway.core.session import Session
from gateway.core.tool import ToolDef
from gateway.core.transcript import ToolOutcome
from gateway.wire.v1 import (
    Error,
    ToolCalls,
    ToolConfirm,
    ToolConfirmation,
    ToolStatus,
    UserMessage,
)
from tests.test_session import Harness, persisted  # noqa: F401

REFUND = ToolDef(
    name="refund",
    description="Refund an amount.",
    kind="server",
    input_schema={
        "type": "object",
        "properties": {"amount": {"type": "integer", "maximum": 500}},
        "required": ["amount"],
    },
    confirm=True,
    confirm_prompt="Refund {amount} euros?",
    confirm_rule="rules:refund",
)
WIPE = ToolDef(
    name="wipe",
    description="Wipe the device.",
    kind="client",
    input_schema={"type": "object"},
    confirm=True,
)


def refund_rule(request: ConfirmRequest) -> Approve | Deny | None:
    amount = request.args["amount"]
    if amount <= 10:
        return Approve()
    if amount > 400:
        return Deny(reason="refunds over 400 need a human")
    return None  # the user decides


def confirming(**settings: Any) -> Harness:
    h = Harness(**settings)
    h.settings = dataclasses.replace(
        h.settings,
        tools=h.settings.tools.extended([REFUND, WIPE]),
        confirm_rules={"rules:refund": refund_rule},
    )
    h.session = Session(h.settings, session_id="sess_1", resume_token="t", new_id=h.new_id)
    h.start()
    return h


def ask(h: Harness, tool: str, **args: Any) -> ToolConfirm | list[Any]:
    h.feed(UserMessage(text=f"{tool} please"))
    sent = h.model(ModelToolCall(name=tool, args=args), ModelFinish())
    asked = [m for m in sent if isinstance(m, ToolConfirm)]
    return asked[0] if asked else sent


def runs(h: Harness) -> list[RunTool]:
    return [e for e in h.other if isinstance(e, RunTool)]


def test_a_call_marked_confirm_waits_for_the_user_and_runs_once_approved():
    h = confirming()
    asked = ask(h, "refund", amount=50)
    assert isinstance(asked, ToolConfirm)
    (item,) = asked.calls
    assert (item.tool, item.prompt, item.kind, item.args) == (
        "refund",
        "Refund 50 euros?",
        "server",
        {"amount": 50},
    )
    assert item.deadline == h.now + 10.0  # the client-call timeout
    assert not runs(h)
    assert [c.call_id for c in h.session.open_confirmations(h.now)] == [item.call_id]
    (running,) = h.feed(ToolConfirmation(call_id=item.call_id, approved=True))
    assert isinstance(running, ToolStatus)
    assert running.status == "running"
    (run,) = runs(h)
    assert run.args == {"amount": 50}
    (again,) = h.feed(ToolConfirmation(call_id=item.call_id, approved=False))
    assert isinstance(again, ToolStatus)
    assert again.duplicate  # decided once
    h.feed(ToolFinished(call_id=run.call_id, output={"ok": True}))
    assert isinstance(h.last_model_call().request.items[-1], ToolOutcome)


def test_a_declined_call_fails_with_the_users_reason_and_never_runs():
    h = confirming()
    asked = ask(h, "refund", amount=50)
    assert isinstance(asked, ToolConfirm)
    (failed,) = h.feed(
        ToolConfirmation(call_id=asked.calls[0].call_id, approved=False, reason="not today")
    )
    assert isinstance(failed, ToolStatus)
    assert (failed.status, failed.code) == ("failed", "declined")
    assert failed.error == "declined by the user: not today"
    outcome = h.last_model_call().request.items[-1]
    assert isinstance(outcome, ToolOutcome)
    assert outcome.error == failed.error  # the model can explain it
    assert not runs(h)


def test_the_user_may_edit_the_arguments_within_the_schema():
    h = confirming()
    asked = ask(h, "refund", amount=50)
    assert isinstance(asked, ToolConfirm)
    call_id = asked.calls[0].call_id
    (refused,) = h.feed(ToolConfirmation(call_id=call_id, approved=True, args={"amount": 900}))
    assert isinstance(refused, Error)
    assert refused.code == "invalid_message"
    assert h.session.open_confirmations(h.now)  # still waiting
    h.feed(ToolConfirmation(call_id=call_id, approved=True, args={"amount": 40}))
    assert runs(h)[0].args == {"amount": 40}


def test_a_rule_approves_or_denies_without_asking():
    h = confirming()
    sent = ask(h, "refund", amount=5)
    assert isinstance(sent, list)
    assert [m.status for m in sent if isinstance(m, ToolStatus)] == ["running"]
    h.feed(ToolFinished(call_id=runs(h)[0].call_id, output={"ok": True}))
    h.model(ModelFinish())
    sent = ask(h, "refund", amount=450)
    assert isinstance(sent, list)
    (denied,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert (denied.status, denied.code) == ("failed", "declined")
    assert denied.error == "declined: refunds over 400 need a human"
    assert len(runs(h)) == 1


def test_an_unanswered_confirmation_expires_and_nothing_runs():
    h = confirming()
    asked = ask(h, "wipe")
    assert isinstance(asked, ToolConfirm)
    assert asked.calls[0].kind == "client"
    h.now = asked.calls[0].deadline
    sent = h.feed(Tick())
    (expired,) = [m for m in sent if isinstance(m, ToolStatus)]
    assert (expired.status, expired.error) == ("expired", "the user did not confirm in time")
    assert not [m for m in h.sent if isinstance(m, ToolCalls)]  # never offered to run


def test_an_approved_client_function_then_goes_out_in_tool_calls():
    h = confirming()
    asked = ask(h, "wipe")
    assert isinstance(asked, ToolConfirm)
    (calls,) = h.feed(ToolConfirmation(call_id=asked.calls[0].call_id, approved=True))
    assert isinstance(calls, ToolCalls)
    assert [c.tool for c in calls.calls] == ["wipe"]
    assert h.session.open_client_calls(h.now)[0].call_id == asked.calls[0].call_id

"""Whether a tool call may run, and whether an outcome may settle it (``gateway.core.call_check``),
as decisions alone; and what the dispatcher does with a late answer to a confirmation."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core.call import Call
from gateway.core.call_check import (
    Cleared,
    Refused,
    before_run,
    echo_mismatch,
    output_problem,
    oversize,
    too_large,
)
from gateway.core.confirm import Approve, ConfirmRequest, Deny
from gateway.core.principal import ANONYMOUS, Principal
from gateway.core.tool import ToolDef, ToolRegistry
from gateway.wire.v1 import ResponseCancel, ToolConfirm, ToolConfirmation, ToolResult, ToolStatus
from tests.test_confirm import REFUND, ask, confirming
from tests.test_session import persisted  # noqa: F401

TOOLS = ToolRegistry(
    [
        msgspec.structs.replace(
            REFUND, output_schema={"type": "object", "required": ["ok"]}, scopes=("billing",)
        ),
        ToolDef(name="ping", description="Ping.", kind="client", input_schema={"type": "object"}),
    ]
)
BILLING = Principal(name="key:k/user:7", kind="client_token", user_id="7", scopes=("billing",))


def refund_rule(request: ConfirmRequest) -> Approve | Deny | None:
    amount = request.args["amount"]
    if amount == 1:
        return Approve(args={"amount": 1000})  # over the schema's maximum
    if amount <= 10:
        return Approve(args={"amount": amount + 1})
    if amount > 400:
        return Deny(reason="refunds over 400 need a human")
    return None


RULES = {"rules:refund": refund_rule}


def call(tool: str = "refund", **args: Any) -> Call:
    return Call(
        call_id="call_1",
        tool=tool,
        display_name=tool.title(),
        kind="server",
        args=args,
        response_id="resp_1",
        deadline=10.0,
    )


def check(c: Call, principal: Principal = BILLING) -> Refused | Cleared:
    return before_run(TOOLS.get(c.tool), c, principal, RULES)


def test_a_call_of_a_tool_the_session_does_not_offer_is_refused():
    assert check(call("nope")) == Refused("unknown tool 'nope'")


def test_a_call_whose_caller_lacks_a_scope_is_refused_as_forbidden():
    refused = check(call(amount=50), ANONYMOUS)
    assert isinstance(refused, Refused)
    assert refused.code == "forbidden"
    assert "'billing'" in refused.error


def test_a_call_with_arguments_off_its_schema_is_refused():
    refused = check(call(amount="ten"))
    assert isinstance(refused, Refused)
    assert (refused.code, refused.error.startswith("invalid arguments: ")) == (None, True)


def test_a_call_of_a_tool_without_confirm_is_cleared_as_asked():
    assert check(call("ping", x=1)) == Cleared({"x": 1})


def test_the_confirmation_rule_approves_denies_or_leaves_it_to_the_user():
    assert check(call(amount=5)) == Cleared({"amount": 6})  # approved, arguments changed
    assert check(call(amount=50)) == Cleared({"amount": 50}, ask=True)  # the user decides
    assert check(call(amount=450)) == Refused("declined: refunds over 400 need a human", "declined")
    refused = check(call(amount=1))  # the rule's own arguments are checked too
    assert isinstance(refused, Refused)
    assert refused.error.startswith("invalid arguments from the confirmation rule: ")


def test_an_outcome_over_the_size_limit_is_measured_as_json():
    assert oversize({"a": "x" * 10}, None) is None
    assert oversize({"a": "x" * 10}, 100) is None
    assert oversize({"a": "x" * 10}, 10) == len('{"a":"xxxxxxxxxx"}')
    assert oversize(object(), 1) is None  # not JSON: not ours to judge
    assert too_large("output", 18, 10) == "output too large: 18 bytes of JSON, the limit is 10"


def test_an_output_must_fit_the_tools_output_schema():
    entry = TOOLS.get("refund")
    assert output_problem(entry, call(), {"ok": True}) is None
    problem = output_problem(entry, call(), {"nope": 1})
    assert problem is not None
    assert problem.startswith("result does not match the output schema")
    assert output_problem(TOOLS.get("ping"), call("ping"), {"anything": 1}) is None


def test_a_result_must_echo_its_calls_tool_and_display_name():
    c = call()
    assert echo_mismatch(ToolResult(call_id="call_1", tool="refund", output={}), c) is None
    wrong_tool = echo_mismatch(ToolResult(call_id="call_1", tool="ping", output={}), c)
    assert wrong_tool is not None
    assert "'ping'" in wrong_tool
    renamed = ToolResult(call_id="call_1", tool="refund", display_name="Money", output={})
    wrong_name = echo_mismatch(renamed, c)
    assert wrong_name is not None
    assert "'Money'" in wrong_name


def test_an_answer_to_a_confirmation_after_its_response_was_cancelled_gets_the_status_again():
    for approved in (True, False):
        h = confirming()
        asked = ask(h, "refund", amount=50)
        assert isinstance(asked, ToolConfirm)
        (item,) = asked.calls
        h.feed(ResponseCancel())
        # The user answers the dialog the cancel raced: the call is over, once only.
        (status,) = h.feed(ToolConfirmation(call_id=item.call_id, approved=approved))
        assert isinstance(status, ToolStatus)
        assert (status.status, status.duplicate) == ("cancelled", True)

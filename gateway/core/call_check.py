"""Whether a tool call may run as the model asked, and whether an outcome may settle it.

Part of the pure session core: decisions only, no effects. ``dispatch`` acts on them. A
call runs only if its tool is one the session offers, its caller has the scopes the tool
requires, its arguments fit the tool's input schema and, for a tool marked ``confirm``,
its confirmation rule does not deny it (``gateway.core.confirm``); otherwise it fails at
once and the model sees why. An outcome (a client's result, a server tool's output or
error) settles its call only within ``max_tool_result_size`` and, when it is an output,
if it fits the tool's output schema and, for a widget, the widget's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gateway.core.call import Call
from gateway.core.confirm import Approve, ConfirmRule, Deny, decide
from gateway.core.inbound import ToolResult
from gateway.core.principal import Principal
from gateway.core.tool import ToolEntry
from gateway.core.widget import answer_problem

__all__ = [
    "Cleared",
    "Refused",
    "before_run",
    "echo_mismatch",
    "output_problem",
    "oversize",
    "too_large",
]


class Refused(msgspec.Struct, frozen=True):
    """The call fails before it runs: ``error`` says why (``code``: ``forbidden``,
    ``declined``)."""

    error: str
    code: str | None = None


class Cleared(msgspec.Struct, frozen=True):
    """The call may run with ``args`` (a confirmation rule may have changed them); with
    ``ask``, once the user approves it."""

    args: dict[str, Any]
    ask: bool = False


def before_run(
    entry: ToolEntry | None,
    call: Call,
    principal: Principal,
    confirm_rules: Mapping[str, ConfirmRule],
) -> Refused | Cleared:
    """Whether ``call`` (of the tool ``entry``, ``None`` when the session offers no such
    tool) may run for ``principal``, and with which arguments."""
    if entry is None:
        return Refused(f"unknown tool {call.tool!r}")
    definition = entry.definition
    if missing := [s for s in definition.scopes if s not in principal.scopes]:
        who = principal.user_id or principal.name
        return Refused(
            f"forbidden: tool {call.tool!r} needs the scope {missing[0]!r},"
            f" which {who!r} does not have",
            "forbidden",
        )
    if problem := entry.input_validator.problem(call.args):
        return Refused(f"invalid arguments: {problem}")
    if not definition.confirm:
        return Cleared(call.args)
    rule = confirm_rules.get(definition.confirm_rule or "")
    decision = decide(rule, call.tool, call.args, principal)
    if isinstance(decision, Deny):
        return Refused(f"declined: {decision.reason}", "declined")
    if isinstance(decision, Approve) and decision.args is not None:
        if problem := entry.input_validator.problem(decision.args):
            return Refused(f"invalid arguments from the confirmation rule: {problem}")
        return Cleared(decision.args)
    return Cleared(call.args, ask=decision is None)  # None: the user decides


def oversize(value: Any, limit: int | None) -> int | None:
    """The bytes of JSON of ``value`` (an output, or an error's text) when over ``limit``
    (``None``: no limit)."""
    if limit is None:
        return None
    try:
        size = len(msgspec.json.encode(value))
    except (TypeError, msgspec.EncodeError):
        return None  # not JSON: the provider reports it; its size is not ours to judge
    return size if size > limit else None


def too_large(what: str, size: int, limit: int | None) -> str:
    """The short error the model and the ``tool.status`` get for an oversized value."""
    return f"{what} too large: {size} bytes of JSON, the limit is {limit}"


def output_problem(entry: ToolEntry | None, call: Call, output: Any) -> str | None:
    """Why ``output`` cannot be ``call``'s result (its tool's output schema, its widget's
    answer), or ``None``."""
    if entry is None or entry.output_validator is None:
        return None
    problem = entry.output_validator.problem(output)
    if problem:
        return f"result does not match the output schema: {problem}"
    if call.widget is not None:
        return answer_problem(call.widget, output)
    return None


def echo_mismatch(result: ToolResult, call: Call) -> str | None:
    """How a result's echo of ``tool``/``display_name`` differs from its call, if it does."""
    if result.tool != call.tool:
        return f"result names tool {result.tool[:64]!r} but call {call.call_id} is {call.tool!r}"
    if result.display_name is not None and result.display_name != call.display_name:
        return (
            f"result names display_name {result.display_name[:64]!r} but call {call.call_id}"
            f" has {call.display_name!r}"
        )
    return None

"""Confirmation of tool calls: a tool marked ``confirm`` is not run on the model's guess alone.

Part of the pure session core. Before such a call runs, a rule may decide it (approve it,
maybe with other arguments, or deny it with a reason) from its arguments and its caller;
otherwise the client is asked (``tool.confirm``) and the user approves, declines, or edits
the arguments and approves (``tool.confirmation``). A declined or denied call fails with the
code ``declined``: the model sees why and can explain it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.core.principal import Principal

__all__ = [
    "Approve",
    "ConfirmRequest",
    "ConfirmRule",
    "Deny",
    "decide",
    "fill",
    "prompt_for",
]


class ConfirmRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a rule decides on: the call and on whose behalf it would run."""

    tool: str
    args: dict[str, Any]
    user_id: str | None = None
    scopes: tuple[str, ...] = ()
    claims: dict[str, Any] = msgspec.field(default_factory=dict)


class Approve(msgspec.Struct, frozen=True, kw_only=True):
    """Run the call without asking; with ``args``, with these arguments instead."""

    args: dict[str, Any] | None = None


class Deny(msgspec.Struct, frozen=True, kw_only=True):
    """Do not run the call; the model gets ``reason``."""

    reason: str


ConfirmRule = Callable[[ConfirmRequest], "Approve | Deny | None"]
"""Decides a call without asking (``Approve``/``Deny``), or leaves it to the user (``None``).
Called in the session core for each call of its tool: keep it quick and free of I/O."""


def decide(rule: ConfirmRule | None, tool: str, args: dict[str, Any], who: Principal) -> Any:
    """What ``rule`` makes of a call: ``Approve``, ``Deny`` or ``None`` (ask the user).

    A rule that raises denies the call, saying so: a broken rule must not let calls through.
    """
    if rule is None:
        return None
    request = ConfirmRequest(
        tool=tool, args=args, user_id=who.user_id, scopes=who.scopes, claims=who.claims
    )
    try:
        decision = rule(request)
    except Exception as exc:  # the rule's bug: refuse, and tell the model why
        return Deny(reason=f"the confirmation rule failed ({type(exc).__name__}: {exc})")
    if decision is None or isinstance(decision, Approve | Deny):
        return decision
    return Deny(reason=f"the confirmation rule returned {type(decision).__name__}")


_FIELD = re.compile(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}")


def prompt_for(template: str | None, display_name: str, args: dict[str, Any]) -> str:
    """The sentence the user is asked: the tool's ``confirm_prompt`` with ``{arg}`` filled
    in, else ``Run <display name> with {...}?``."""
    if template:
        return fill(template, args)
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True)
    if len(shown) > 200:
        shown = shown[:197] + "..."
    return f"Run {display_name} with {shown}?" if args else f"Run {display_name}?"


def fill(template: str, args: dict[str, Any]) -> str:
    """``template`` with each ``{arg}`` replaced by that argument (empty when absent)."""
    return _FIELD.sub(lambda m: _text(args.get(m.group(1), "")), template)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

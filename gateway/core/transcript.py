"""The conversation as the model sees it: a provider-neutral list of items.

Each provider adapter maps these items into its own wire format.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = [
    "CANCELLED",
    "PENDING",
    "AssistantTurn",
    "ContextNote",
    "Item",
    "RequestedCall",
    "ToolOutcome",
    "UserTurn",
    "completion_note",
    "parse_completion_note",
]

PENDING: dict[str, Any] = {"status": "pending"}
"""What the model gets at once as the result of an async tool call."""
CANCELLED = "cancelled by the user"
"""The error a call cancelled with its response gives the model."""


class UserTurn(msgspec.Struct, frozen=True, kw_only=True, tag="user"):
    """What the user said."""

    text: str


class RequestedCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call the model asked for, under the gateway's own call id."""

    call_id: str
    name: str
    args: dict[str, Any]


class AssistantTurn(msgspec.Struct, frozen=True, kw_only=True, tag="assistant"):
    """One model step: its text and the tool calls it asked for."""

    text: str = ""
    calls: tuple[RequestedCall, ...] = ()


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True, tag="tool_outcome"):
    """What a tool call gave back to the model: an output or an error."""

    call_id: str
    name: str
    output: Any = None
    error: str | None = None


class ContextNote(msgspec.Struct, frozen=True, kw_only=True, tag="context"):
    """Context for the model that no one said: the outcome of an async tool call."""

    text: str
    call_id: str | None = None


Item = UserTurn | AssistantTurn | ToolOutcome | ContextNote

_NOTE = re.compile(
    r"^<context>function \[(?P<name>[a-z][a-z0-9_]*)\] "
    r"(?P<verb>completed with response|failed with error) (?P<json>.*)</context>$",
    re.DOTALL,
)


def completion_note(name: str, *, output: Any = None, error: str | None = None) -> str:
    """The context an async call's outcome reaches the model as.

    ``<context>function [NAME] completed with response JSON</context>``, or
    ``<context>function [NAME] failed with error "MESSAGE"</context>``.
    """
    if error is not None:
        outcome = f"failed with error {msgspec.json.encode(error).decode()}"
    else:
        outcome = f"completed with response {msgspec.json.encode(output).decode()}"
    return f"<context>function [{name}] {outcome}</context>"


def parse_completion_note(text: str) -> tuple[str, Any, str | None] | None:
    """``(name, output, error)`` from a ``completion_note``, or ``None`` for other text."""
    found = _NOTE.match(text)
    if found is None:
        return None
    try:
        value = msgspec.json.decode(found.group("json"))
    except msgspec.DecodeError:
        return None
    if found.group("verb").startswith("failed"):
        return found.group("name"), None, str(value)
    return found.group("name"), value, None

"""The conversation as the model sees it: a provider-neutral list of items.

Each provider adapter maps these items into its own wire format.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["AssistantTurn", "Item", "RequestedCall", "ToolOutcome", "UserTurn"]


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


Item = UserTurn | AssistantTurn | ToolOutcome

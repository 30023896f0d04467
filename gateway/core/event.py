"""What flows through the session core: events in, effects out.

Events are everything that can happen to a session besides client messages
(which are ``gateway.wire.v1`` types): model output, tool outcomes, time, the
socket going away. Effects are what the core asks its driver to do.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core.call import Call
from gateway.core.inbound import DecodeFailure, Inbound
from gateway.core.model import ModelEvent, ModelRequest
from gateway.core.outbound import ServerMsg

__all__ = [
    "CallModel",
    "CancelModel",
    "CancelTool",
    "Disconnected",
    "Effect",
    "Event",
    "ModelFailed",
    "ModelOutput",
    "RunTool",
    "SaveCall",
    "Send",
    "ShuttingDown",
    "Tick",
    "ToolFinished",
    "ToolProgress",
]

# --------------------------------------------------------------------- events


class Tick(msgspec.Struct, frozen=True):
    """Time passed; the session expires what is due."""


class ModelOutput(msgspec.Struct, frozen=True):
    """An event of the model stream started by ``CallModel(step_id)``."""

    step_id: str
    event: ModelEvent


class ModelFailed(msgspec.Struct, frozen=True):
    """The model stream of ``step_id`` broke."""

    step_id: str
    message: str
    retryable: bool = True


class ToolFinished(msgspec.Struct, frozen=True, kw_only=True, tag="tool_finished"):
    """A server tool returned (``output``) or raised (``error``)."""

    call_id: str
    output: Any = None
    error: str | None = None
    code: str | None = None
    """With ``error``: ``forbidden`` when the tool refused the caller."""


class ToolProgress(msgspec.Struct, frozen=True, kw_only=True, tag="tool_progress"):
    """A running server tool reported progress (any JSON value)."""

    call_id: str
    payload: Any = None


class Disconnected(msgspec.Struct, frozen=True):
    """The session is over (its socket is gone for good): stop all its work."""


class ShuttingDown(msgspec.Struct, frozen=True):
    """The gateway is stopping: cut the running response (``incomplete``)."""


Event = (
    Inbound
    | DecodeFailure
    | Tick
    | ModelOutput
    | ModelFailed
    | ToolFinished
    | ToolProgress
    | Disconnected
    | ShuttingDown
)

# --------------------------------------------------------------------- effects


class Send(msgspec.Struct, frozen=True):
    """Send this event to the client (its ``seq`` is already set)."""

    msg: ServerMsg


class CallModel(msgspec.Struct, frozen=True):
    """Start a model step; its events come back as ``ModelOutput(step_id)``."""

    step_id: str
    response_id: str
    request: ModelRequest
    agent: str = ""
    """Whose model: the session's agent at the time (``""``: the gateway's own)."""


class CancelModel(msgspec.Struct, frozen=True):
    """Stop the model step now; its later output is ignored anyway."""

    step_id: str


class RunTool(msgspec.Struct, frozen=True, kw_only=True):
    """Run a server tool; its outcome comes back as ``ToolFinished(call_id)``."""

    call_id: str
    tool: str
    args: dict[str, Any]
    response_id: str
    agent: str = ""
    """Whose tool: the session's agent at the time (``""``: the gateway's own)."""


class CancelTool(msgspec.Struct, frozen=True):
    """Cancel a running server tool; its late outcome is ignored."""

    call_id: str


class SaveCall(msgspec.Struct, frozen=True):
    """A call's record changed: keep it in the store's ledger."""

    call: Call


Effect = Send | CallModel | CancelModel | RunTool | CancelTool | SaveCall

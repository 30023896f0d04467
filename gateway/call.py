"""One lifecycle for every tool call, client function or server tool.

``requested -> running -> (pending -> progress*) -> completed | failed | cancelled | expired``

A ``Call`` is a plain record (serialisable, so a store can keep it); ``advance``
refuses any transition the lifecycle does not allow, which makes a double
settlement a loud bug instead of a silent second result.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

__all__ = ["Call", "CallState", "IllegalTransition"]


class CallState(enum.StrEnum):
    REQUESTED = "requested"
    RUNNING = "running"
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


_TERMINAL = frozenset(
    {CallState.COMPLETED, CallState.FAILED, CallState.CANCELLED, CallState.EXPIRED}
)
_ALLOWED: dict[CallState, frozenset[CallState]] = {
    CallState.REQUESTED: frozenset({CallState.RUNNING, *_TERMINAL}),
    CallState.RUNNING: frozenset({CallState.PENDING, *_TERMINAL}),
    CallState.PENDING: frozenset(
        {CallState.COMPLETED, CallState.FAILED, CallState.CANCELLED, CallState.EXPIRED}
    ),
}


class IllegalTransition(RuntimeError):
    """A bug: something tried to move a call along an edge the lifecycle lacks."""


class Call(msgspec.Struct, kw_only=True):
    """A tool call and everything known about it."""

    call_id: str
    tool: str
    display_name: str
    kind: Literal["client", "server"]
    args: dict[str, Any]
    response_id: str
    deadline: float
    state: CallState = CallState.REQUESTED
    output: Any = None
    error: str | None = None

    @property
    def settled(self) -> bool:
        """True once the call reached a terminal state."""
        return self.state in _TERMINAL

    def advance(self, state: CallState) -> None:
        """Move to ``state``.

        Raises:
            IllegalTransition: the lifecycle has no such edge (e.g. a second result).
        """
        if state not in _ALLOWED.get(self.state, frozenset()):
            raise IllegalTransition(f"call {self.call_id}: {self.state} -> {state}")
        self.state = state

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

from gateway.core.inbound import Widget

__all__ = ["Call", "CallState", "IllegalTransition", "Ledger"]


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


_KEPT_ERROR_CHARS = 512
"""Characters of a settled call's error kept in the ledger (see ``Call.slim``)."""


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
    execution: Literal["sync", "async"] = "sync"
    delivery: Literal["when_idle", "interrupt", "silent"] = "when_idle"
    state: CallState = CallState.REQUESTED
    dispatched: bool = False
    """It reached whoever runs it (a failed argument check stops it before that)."""
    elsewhere: bool = False
    """A server tool started by another gateway node, which this session left (it was
    adopted here): its outcome comes only if that node lives to post it."""
    output: Any = None
    error: str | None = None
    code: str | None = None
    """Why it failed, as a code, when there is one: ``forbidden``."""
    manual: bool = False
    """A server tool offered to the client (manual tool mode): ``kind`` is ``client``
    until the client has the gateway run it (``tool.run``)."""
    confirming: bool = False
    """Waiting for the user's approval (``tool.confirm``); its deadline is the answer's."""
    widget: Widget | None = None
    """A widget tool's call: the widget the client shows, filled in (``gateway.core.widget``)."""
    handle: dict[str, Any] | None = None
    """Where a running server tool's work can be found again (a remote agent's task id,
    say): a node that takes the session over re-attaches to it there."""

    @property
    def settled(self) -> bool:
        """True once the call reached a terminal state."""
        return self.state in _TERMINAL

    @property
    def blocking(self) -> bool:
        """True while the model step that asked for it must wait for it.

        An async call stops blocking once it is pending: the model has its
        ``{"status": "pending"}`` answer and the real result comes later.
        """
        return self.state in (CallState.REQUESTED, CallState.RUNNING)

    def slim(self) -> None:
        """Forget what a settled call no longer needs once the model has its outcome:
        its arguments and output (the transcript has them, within its budget). What a
        repeated result is answered with (tool, state, a short error) stays, so that the
        ledger's memory is bounded by its count of calls, not by their payloads."""
        assert self.settled
        self.args, self.output, self.handle = {}, None, None
        if self.error is not None and len(self.error) > _KEPT_ERROR_CHARS:
            self.error = self.error[:_KEPT_ERROR_CHARS] + "..."

    def advance(self, state: CallState) -> None:
        """Move to ``state``.

        Raises:
            IllegalTransition: the lifecycle has no such edge (e.g. a second result).
        """
        if state not in _ALLOWED.get(self.state, frozenset()):
            raise IllegalTransition(f"call {self.call_id}: {self.state} -> {state}")
        self.state = state


class Ledger:
    """The calls of a session by id, settled ones included, so that a repeated
    result is recognised and answered with the stored outcome.

    Bounded: past ``max_calls`` the oldest settled calls are forgotten (a result
    for one of those then gets ``unknown_call``); open calls are always kept.
    """

    def __init__(self, max_calls: int = 1_000) -> None:
        self._max_calls = max_calls
        self._calls: dict[str, Call] = {}
        self._open: dict[str, Call] = {}

    def add(self, call: Call) -> None:
        self._calls[call.call_id] = call
        self._open[call.call_id] = call
        if len(self._calls) > self._max_calls:
            excess = len(self._calls) - self._max_calls
            oldest = [c.call_id for c in self._calls.values() if c.settled][:excess]
            for call_id in oldest:
                del self._calls[call_id]

    def calls(self) -> list[Call]:
        """Every call kept, oldest first (open ones and recent settled ones)."""
        return list(self._calls.values())

    @classmethod
    def restore(cls, calls: list[Call], max_calls: int = 1_000) -> Ledger:
        """The ledger ``calls()`` returned (from a ``SessionState``)."""
        ledger = cls(max_calls)
        for call in calls:
            ledger._calls[call.call_id] = call
            if not call.settled:
                ledger._open[call.call_id] = call
        return ledger

    def get(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def open_calls(self) -> list[Call]:
        """Calls not settled yet, oldest first."""
        for call_id in [c.call_id for c in self._open.values() if c.settled]:
            del self._open[call_id]
        return list(self._open.values())

    def next_deadline(self) -> float | None:
        if not self._open:  # asked before every event the session takes: mostly none open
            return None
        return min((call.deadline for call in self.open_calls()), default=None)

    def due(self, now: float) -> list[Call]:
        """Open calls whose deadline has passed."""
        return [call for call in self.open_calls() if call.deadline <= now]

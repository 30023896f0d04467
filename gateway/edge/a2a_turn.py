"""One A2A task as a gateway turn: what the session's events mean for the task.

An A2A message is one ``user.message``, whose ``id`` is the task's id; the session's
answer to it is the response created ``in_reply_to`` that id. ``Turn`` reads the session's
events one by one (``feed``) and says what the task should tell its caller: the text as it
streams (``Text``), a short status line for each step of a server tool (``Status``), and
once, how the task ends (``End``).

The task ends when its response is done and no async tool it started is still running:
a tool that answered ``pending`` keeps the task working until its result is in, and the
response that tells its result (``response.created`` with the call's ``call_id``) is part
of the task too, its text added to the answer. Whether more comes after a ``response.done``
can only be known once the events that came with it are all read (an async result's
response starts in the same round of the session's loop), so the end is decided by
``settle``, called after each batch of events. Nothing here awaits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gateway.wire.v1 import (
    Error,
    Outbound,
    ResponseCreated,
    ResponseDone,
    TextDelta,
    ToolStatus,
)

__all__ = ["End", "Output", "Status", "Text", "Turn"]

_BETWEEN_RESPONSES = "\n\n"
"""Between the texts of two responses of a task (its answer, an async result's)."""
_PROGRESS_CHARS = 200
"""A tool's progress report, as JSON, is cut to this in a status line."""


@dataclass(frozen=True, slots=True)
class Text:
    """More of the answer's text."""

    delta: str


@dataclass(frozen=True, slots=True)
class Status:
    """What a server tool of the task is doing, in a few words."""

    text: str


@dataclass(frozen=True, slots=True)
class End:
    """How the task ends: ``reason`` says why one did not complete."""

    state: Literal["completed", "failed", "canceled"]
    reason: str = ""


Output = Text | Status | End


class Turn:
    """The events of one task's turn, read into what its caller is told.

    Args:
        message_id: the ``user.message``'s id (the task's).
    """

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.response_id: str | None = None
        """The response answering the message, once created."""
        self._responses: set[str] = set()
        """This task's responses still running: its answer, its async results' ones."""
        self._calls: set[str] = set()
        """Every tool call of this task's responses."""
        self._running_async: set[str] = set()
        """Its async calls that said ``pending`` and have no outcome yet."""
        self._outputs: list[Output] = []
        self._spoken = False
        """Some text of the task was said already."""
        self._speaking: str | None = None
        """The response whose text came last."""
        self._failure = ""
        """The last error of this task's responses: why it failed, if it does."""
        self._last_status: str | None = None
        """How this task's latest response ended: an async tool that interrupts the answer
        cancels it, and the response telling its result is the task's last word."""
        self.ended = False

    def take(self) -> list[Output]:
        """What the task should say since the last call."""
        outputs, self._outputs = self._outputs, []
        return outputs

    def feed(self, msg: Outbound) -> None:
        """One event of the session, in order."""
        if self.ended:
            return
        match msg:
            case TextDelta(response_id=rid, delta=delta) if rid in self._responses:
                if self._spoken and rid != self._speaking:
                    delta = _BETWEEN_RESPONSES + delta  # another response's text begins
                self._spoken, self._speaking = True, rid
                self._outputs.append(Text(delta))
            case ResponseCreated(response_id=rid, in_reply_to=reply) if reply == self.message_id:
                self.response_id = rid
                self._responses.add(rid)
            case ResponseCreated(response_id=rid, call_id=call) if call in self._calls:
                self._responses.add(rid)
            case ToolStatus() if msg.response_id in self._responses or msg.call_id in self._calls:
                self._tool_status(msg)
            case ResponseDone(response_id=rid, status=status) if rid in self._responses:
                self._responses.discard(rid)
                self._last_status = status
            case Error(in_reply_to=reply) if reply == self.message_id:
                # The message itself was refused (too long, a usage limit...): no response.
                self._end(End("failed", f"{msg.code}: {msg.message}"))
            case Error(response_id=rid) if rid in self._responses:
                self._failure = f"{msg.code}: {msg.message}"
            case _:
                pass

    def settle(self) -> None:
        """The events read so far are a whole batch: end the task if nothing is left."""
        status = self._last_status
        if self.ended or status is None or self._responses or self._running_async:
            return
        if status == "completed":
            self._end(End("completed"))
        elif status == "cancelled":
            self._end(End("canceled", "the response was cancelled"))
        else:
            self._end(End("failed", self._failure or f"the response ended {status}"))

    def gone(self, reason: str) -> None:
        """The session's socket closed (the session ended, the gateway stops...)."""
        if self.ended:
            return
        self.settle()
        if not self.ended:
            self._end(End("failed", reason or "the conversation ended"))

    def _end(self, end: End) -> None:
        self.ended = True
        self._outputs.append(end)

    def _tool_status(self, msg: ToolStatus) -> None:
        self._calls.add(msg.call_id)
        tool = msg.tool
        match msg.status:
            case "running":
                said = f"{tool}: running"
            case "pending":
                self._running_async.add(msg.call_id)
                said = f"{tool}: started, working in the background"
            case "progress":
                said = f"{tool}: {_shown(msg.progress)}"
            case "completed":
                self._running_async.discard(msg.call_id)
                said = f"{tool}: done"
            case status:  # failed, cancelled, expired
                self._running_async.discard(msg.call_id)
                said = f"{tool}: {status}" + (f" ({msg.error})" if msg.error else "")
        if msg.status != "requested":
            self._outputs.append(Status(said))


def _shown(progress: Any) -> str:
    """A tool's progress report in a status line: its text, or short JSON."""
    if progress is msgspec.UNSET:
        return "working"
    if isinstance(progress, str):
        return progress[:_PROGRESS_CHARS]
    text = json.dumps(progress, ensure_ascii=False, default=str)
    return text if len(text) <= _PROGRESS_CHARS else text[: _PROGRESS_CHARS - 1] + "…"

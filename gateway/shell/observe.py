"""Observers of a session: what the driver tells the world about it, in one place.

The driver reports every server event it sends, and a socket attaching, detaching and
the session's end, to a list of observers. Logging and metrics are two observers of that
one stream, so they cannot disagree about what happened. Observers run on the session's
task: they must be quick and must not raise (a failing observer is logged and skipped by
the driver, the session carries on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec
import structlog

from gateway.wire.v1 import (
    AudioDone,
    AudioFlush,
    Error,
    InputTranscript,
    ResponseCreated,
    ResponseDone,
    ServerMsg,
    SessionCreated,
    TextDelta,
    ToolCalls,
    ToolStatus,
)

__all__ = ["LogObserver", "SessionObserver"]

log = structlog.get_logger("gateway.driver")


class SessionObserver(Protocol):
    """Something that watches one session's life (logs, metrics...).

    ``now`` is the driver's clock (wall-clock seconds) when the thing happened.
    """

    def started(self, now: float) -> None:
        """The session's driver started running (no socket attached yet)."""

    def sent(self, msg: ServerMsg, now: float) -> None:
        """The session sent ``msg`` (logged for replay, queued on the socket if any)."""

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        """A socket became the session's; ``replaced`` when it took over a live one."""

    def detached(self, *, ended: bool, now: float) -> None:
        """The session's socket went; with ``ended`` the client closed it for good."""

    def ended(self, now: float) -> None:
        """The session is over (whatever the reason)."""


class LogObserver:
    """One log line per noteworthy event: never user text or arguments, only sizes.

    Args:
        metadata: the session's metadata (its size is logged when the session starts).
    """

    def __init__(self, metadata: Callable[[], object]) -> None:
        self._metadata = metadata
        self._response_started: dict[str, float] = {}

    def started(self, now: float) -> None:
        pass

    def sent(self, msg: ServerMsg, now: float) -> None:
        if type(msg) is TextDelta:  # the most frequent event by far, and never logged
            return
        match msg:
            case SessionCreated(agent=agent, tools=tools):
                log.info(
                    "session_started",
                    agent=agent,
                    tools=len(tools),
                    metadata_size=len(msgspec.json.encode(self._metadata())),
                )
            case ResponseCreated(response_id=response_id):
                self._response_started[response_id] = now
                log.info("response_started", response_id=response_id, call_id=msg.call_id)
            case ResponseDone(response_id=response_id, usage=usage):
                started = self._response_started.pop(response_id, now)
                log.info(
                    "response_finished",
                    response_id=response_id,
                    status=msg.status,
                    duration_ms=round((now - started) * 1000, 1),
                    input_tokens=usage.input_tokens if usage else None,
                    output_tokens=usage.output_tokens if usage else None,
                )
            case ToolCalls(response_id=response_id, calls=calls):
                for call in calls:
                    log.info(
                        "client_call_sent",
                        response_id=response_id,
                        call_id=call.call_id,
                        tool=call.tool,
                        args_size=len(msgspec.json.encode(call.args)),
                    )
            case ToolStatus(status=status) if status not in ("running", "pending", "progress"):
                log.info(
                    "tool_call_settled",
                    response_id=msg.response_id,
                    call_id=msg.call_id,
                    tool=msg.tool,
                    status=status,
                    duplicate=msg.duplicate,
                )
            case Error(code=code):
                log.info("error_sent", code=code, call_id=msg.call_id, in_reply_to=msg.in_reply_to)
            case InputTranscript(final=True):  # its size, never the words
                log.info("user_heard", message_id=msg.message_id, chars=len(msg.text))
            case AudioFlush(response_id=response_id):
                log.info("barge_in", response_id=response_id)
            case AudioDone(response_id=response_id):
                log.info(
                    "answer_spoken",
                    response_id=response_id,
                    audio_ms=msg.audio_ms,
                    status=msg.status,
                )
            case _:
                pass

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        pass  # the driver logs takeovers and resumes itself (it knows the cursors)

    def detached(self, *, ended: bool, now: float) -> None:
        pass

    def ended(self, now: float) -> None:
        pass

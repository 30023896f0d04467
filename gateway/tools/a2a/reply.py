"""What a remote A2A agent's replies mean to the gateway, for ``gateway.tools.a2a.backend``.

One call sends one message; the agent answers with a message (the result at once) or a
task, followed through its status and artifact updates to a final state. ``TaskFollower``
reads those events one by one: progress for each status update that says something, the
artifacts' text when the task completes, the agent's question when it asks for input
(``input_required``: the model asks the user and answers into the same task), a
``ToolError`` with the reason when it fails. Nothing here awaits or touches the connection.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.helpers import get_data_parts
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
)

from gateway.errors import ToolError
from gateway.tools.base import ReportProgress

__all__ = ["INPUT_REQUIRED", "MAX_RESULT_CHARS", "TaskFollower", "message_text", "state_name"]

_OPEN = frozenset({TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING})
"""States of a task still running: more events follow."""

_FAILED = {
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_REJECTED: "rejected the request",
    TaskState.TASK_STATE_CANCELED: "was cancelled",
    TaskState.TASK_STATE_AUTH_REQUIRED: "needs authentication the gateway cannot give",
}


MAX_RESULT_CHARS = 8 * 2**20
"""Characters of a task's artifacts kept for its result (as an OpenAPI tool's answer is
bounded): an agent that streams more fails the call instead of filling the gateway's
memory. The result must still fit ``max_tool_result_size`` to reach the model."""

INPUT_REQUIRED = "input_required"
"""The ``status`` of a call's result when the remote task waits for the user's answer."""

_ANSWER_HOW = (
    "The remote agent needs more input before it can go on. Ask the user this question;"
    " then call this tool again with their answer as the message (and this task_id)."
)


def state_name(state: TaskState) -> str:
    """``TASK_STATE_WORKING`` -> ``working``: what progress payloads and logs say."""
    return str(TaskState.Name(state)).removeprefix("TASK_STATE_").lower()


def _parts_text(parts: Any) -> str:
    """The text parts, joined; data parts are shown as JSON, files by name or URL."""
    texts: list[str] = []
    part: Part
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            texts += [json.dumps(data) for data in get_data_parts([part])]
        elif kind in ("url", "raw"):
            texts.append(f"[file {part.filename or part.url or part.media_type or 'attached'}]")
    return "\n".join(t for t in texts if t)


def message_text(message: Message) -> str:
    return _parts_text(message.parts)


class TaskFollower:
    """The events of one call, in order, until its result.

    Args:
        progress: where status updates that carry a message are reported, as
            ``{"state": "working", "message": "..."}``.
    """

    def __init__(self, progress: ReportProgress) -> None:
        self.progress = progress
        self.task_id: str | None = None
        self.state: TaskState = TaskState.TASK_STATE_UNSPECIFIED
        self._artifacts: dict[str, list[str]] = {}
        self._chars = 0
        """Characters of the artifacts kept: bounded by ``MAX_RESULT_CHARS``."""
        """Text of each artifact, by id, in the order they came (chunks appended)."""

    @property
    def open(self) -> bool:
        """A task was started and has not ended: cancelling the call should cancel it."""
        return self.task_id is not None and self.state in _OPEN | {TaskState.TASK_STATE_UNSPECIFIED}

    def feed(self, event: StreamResponse) -> tuple[bool, Any]:
        """Take one event.

        Returns:
            ``(True, result)`` once the call has its result (a text, or, for a task asking
            for input, ``{"status": "input_required", "question", "task_id", "note"}``);
            ``(False, None)`` while more events are to come.

        Raises:
            ToolError: the task ended without completing, or the reply is malformed.
        """
        kind = event.WhichOneof("payload")
        if kind == "message":
            return True, message_text(event.message)
        if kind == "task":
            return self._task(event.task)
        if kind == "artifact_update":
            update = event.artifact_update
            self._artifact(update.artifact, append=update.append)
            return False, None
        if kind == "status_update":
            self._started(event.status_update.task_id)
            return self._status(event.status_update.status)
        raise ToolError("the remote agent sent a reply with neither a message nor a task")

    def _started(self, task_id: str) -> None:
        if not task_id:
            raise ToolError("the remote agent sent a task without an id")
        self.task_id = task_id

    def _task(self, task: Task) -> tuple[bool, Any]:
        """A whole task: the first event of a stream, or the answer of a blocking send."""
        self._started(task.id)
        self._artifacts.clear()  # the task carries them all
        self._chars = 0
        for artifact in task.artifacts:
            self._artifact(artifact, append=False)
        return self._status(task.status, report=False)

    def _artifact(self, artifact: Artifact, *, append: bool) -> None:
        text = _parts_text(artifact.parts)
        key = artifact.artifact_id or str(len(self._artifacts))
        if not append or key not in self._artifacts:
            self._chars -= sum(map(len, self._artifacts.get(key, ())))
        self._chars += len(text)
        if self._chars > MAX_RESULT_CHARS:
            raise ToolError(
                f"the remote agent's answer is over {MAX_RESULT_CHARS // 2**20} Mi characters"
            )
        if append and key in self._artifacts:
            self._artifacts[key].append(text)
        else:
            self._artifacts[key] = [text]

    def _status(self, status: TaskStatus, *, report: bool = True) -> tuple[bool, Any]:
        self.state = status.state
        said = message_text(status.message) if status.HasField("message") else ""
        if status.state in _OPEN or status.state == TaskState.TASK_STATE_UNSPECIFIED:
            if report and said:
                self.progress({"state": state_name(status.state), "message": said})
            return False, None
        if status.state == TaskState.TASK_STATE_COMPLETED:
            texts = ["".join(chunks) for chunks in self._artifacts.values()]
            return True, "\n".join(t for t in texts if t) or said
        if status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            return True, {
                "status": INPUT_REQUIRED,
                "question": said or "(the agent did not say what it needs)",
                "task_id": self.task_id,
                "note": _ANSWER_HOW,
            }
        reason = _FAILED.get(status.state, f"ended in state {state_name(status.state)}")
        raise ToolError(f"the remote task {reason}" + (f": {said}" if said else ""))

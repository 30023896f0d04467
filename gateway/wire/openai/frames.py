"""The OpenAI Realtime (GA) server events the gateway writes, and their items.

Pure: no I/O. ``Frames`` numbers the events of one connection (each needs an
``event_id``) and encodes them; the shapes follow the ``openai`` package's types
(``openai.types.realtime``): items carry ``object: realtime.item``, responses
``object: realtime.response``, content parts of a response are ``text`` parts, or ``audio``
parts with their transcript when the session speaks.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

__all__ = [
    "PENDING_OUTPUT",
    "Frames",
    "call_item",
    "message_item",
    "output_item",
    "response_body",
    "to_json",
]

PENDING_OUTPUT = '{"status":"pending"}'
"""The output of an async server tool's call until its result comes (what the model got)."""

_encode = msgspec.json.Encoder().encode


def to_json(value: Any) -> str:
    return _encode(value).decode()


def message_item(
    item_id: str, role: str, status: str, parts: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
        "content": parts,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_item(item_id: str, call_id: str, output: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call_output",
        "status": "completed",
        "call_id": call_id,
        "output": output,
    }


def response_body(
    response_id: str,
    status: str,
    output: list[dict[str, Any]],
    usage: tuple[int, int] | None = None,
    details: dict[str, Any] | None = None,
    *,
    spoken: bool = False,
) -> dict[str, Any]:
    """A response object (``RealtimeResponse``); ``usage`` is ``(input, output)`` tokens."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output,
        "output_modalities": ["audio"] if spoken else ["text"],
    }
    if usage is not None:
        body["usage"] = {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
    if details is not None:
        body["status_details"] = details
    return body


class Frames:
    """The server events of one connection, each with the next ``event_id``."""

    def __init__(self) -> None:
        self._count = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        self._count += 1
        return _encode({"type": kind, "event_id": f"event_{self._count}", **fields})

    def item(self, item: dict[str, Any], previous: str | None) -> list[bytes]:
        """A whole conversation item, added and done at once."""
        return [
            self.event("conversation.item.added", previous_item_id=previous, item=item),
            self.event("conversation.item.done", previous_item_id=previous, item=item),
        ]

    def error(self, event_id: str | None, kind: str, code: str, message: str) -> bytes:
        error = {"type": kind, "code": code, "message": message, "event_id": event_id}
        return self.event("error", error={**error, "param": None})

    def text_started(
        self,
        response_id: str,
        index: int,
        item: dict[str, Any],
        previous: str | None,
        *,
        spoken: bool = False,
    ) -> list[bytes]:
        """An assistant message begins: its item and its one part, text or (``spoken``)
        audio with its transcript."""
        where = {"response_id": response_id, "item_id": item["id"], "output_index": index}
        part = {"type": "audio", "transcript": ""} if spoken else {"type": "text", "text": ""}
        return [
            self.event("response.output_item.added", **_output(response_id, index, item)),
            self.event("conversation.item.added", previous_item_id=previous, item=item),
            self.event("response.content_part.added", **where, content_index=0, part=part),
        ]

    def text_delta(
        self, response_id: str, item_id: str, index: int, delta: str, *, spoken: bool = False
    ) -> bytes:
        """A piece of an assistant message's text: of its audio's transcript, ``spoken``."""
        return self.event(
            "response.output_audio_transcript.delta" if spoken else "response.output_text.delta",
            response_id=response_id,
            item_id=item_id,
            output_index=index,
            content_index=0,
            delta=delta,
        )

    def text_segment(self, response_id: str, item_id: str, index: int, text: str) -> bytes:
        """Not in OpenAI's protocol: a speakable piece of an assistant message's text
        (v1 ``text.segment``), for sessions that asked for them (``session.gateway``)."""
        return self.event(
            "response.output_text.segment",
            response_id=response_id,
            item_id=item_id,
            output_index=index,
            content_index=0,
            text=text,
        )

    def text_done(
        self, response_id: str, index: int, item: dict[str, Any], text: str
    ) -> list[bytes]:
        """An assistant message ends (``item`` holds its text and status)."""
        where = {"response_id": response_id, "item_id": item["id"], "output_index": index}
        return [
            self.event("response.output_text.done", **where, content_index=0, text=text),
            self.event(
                "response.content_part.done",
                **where,
                content_index=0,
                part={"type": "text", "text": text},
            ),
            self.event("response.output_item.done", **_output(response_id, index, item)),
            self.event("conversation.item.done", item=item),
        ]

    def audio_done(
        self, response_id: str, index: int, item: dict[str, Any], transcript: str
    ) -> list[bytes]:
        """A spoken assistant message ends, its audio all sent (``item`` holds its
        transcript and status)."""
        where = {"response_id": response_id, "item_id": item["id"], "output_index": index}
        return [
            self.event("response.output_audio.done", **where, content_index=0),
            self.event(
                "response.output_audio_transcript.done",
                **where,
                content_index=0,
                transcript=transcript,
            ),
            self.event(
                "response.content_part.done",
                **where,
                content_index=0,
                part={"type": "audio", "transcript": transcript},
            ),
            self.event("response.output_item.done", **_output(response_id, index, item)),
            self.event("conversation.item.done", item=item),
        ]

    def audio_delta(self, response_id: str, item_id: str, index: int, audio: bytes) -> bytes:
        """A piece of an assistant message's audio, in the session's output format."""
        return self.event(
            "response.output_audio.delta",
            response_id=response_id,
            item_id=item_id,
            output_index=index,
            content_index=0,
            delta=base64.b64encode(audio).decode("ascii"),
        )

    def function_call(
        self, response_id: str, index: int, done: dict[str, Any], previous: str | None
    ) -> list[bytes]:
        """A client function's call, as a response's output (``done``: its whole item)."""
        added = {**done, "status": "in_progress", "arguments": ""}
        where = {
            "response_id": response_id,
            "item_id": done["id"],
            "output_index": index,
            "call_id": done["call_id"],
        }
        return [
            self.event("response.output_item.added", **_output(response_id, index, added)),
            self.event("conversation.item.added", previous_item_id=previous, item=added),
            self.event("response.function_call_arguments.delta", **where, delta=done["arguments"]),
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=done["name"],
                arguments=done["arguments"],
            ),
            self.event("response.output_item.done", **_output(response_id, index, done)),
            self.event("conversation.item.done", item=done),
        ]


def _output(response_id: str, index: int, item: dict[str, Any]) -> dict[str, Any]:
    return {"response_id": response_id, "output_index": index, "item": item}

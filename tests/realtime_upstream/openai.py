"""OpenAI Realtime, GA protocol: the session of one ``/v1/realtime`` connection.

Event and field names as in openai-python's ``src/openai/types/realtime/``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection

from tests.realtime_upstream.session import (
    JSON,
    Connection,
    ModelOutput,
    RealtimeSession,
    ScriptedCall,
    b64,
    deep_merge,
    text_tokens,
)
from tests.realtime_upstream.vad import OUTPUT_RATE, EnergyVad, pcm_ms

if TYPE_CHECKING:
    from tests.realtime_upstream import RealtimeUpstream

OPENAI_INPUT_RATE = 24000
SESSION_EXPIRED = "Your session hit the maximum duration of 60 minutes."
PCM24K = {"type": "audio/pcm", "rate": 24000}


class OpenAISession(RealtimeSession):
    def __init__(self, upstream: RealtimeUpstream, ws: ServerConnection, conn: Connection) -> None:
        super().__init__(upstream, ws, conn)
        self.session: JSON = {
            "type": "realtime",
            "object": "realtime.session",
            "id": upstream.new_id("sess"),
            "model": model_in(conn.path),
            "output_modalities": ["audio"],
            "instructions": "You are a helpful assistant.",
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
            "audio": {
                "input": {
                    "format": PCM24K,
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": {
                        "type": "server_vad",
                        "threshold": 0.5,
                        "prefix_padding_ms": 300,
                        "silence_duration_ms": 500,
                        "create_response": True,
                        "interrupt_response": True,
                    },
                },
                "output": {"format": PCM24K, "voice": "marin", "speed": 1.0},
            },
        }
        self.conversation_id = upstream.new_id("conv")
        self.buffer = bytearray()
        self.vad = EnergyVad(OPENAI_INPUT_RATE, upstream.vad_threshold, self.silence_ms)
        self.speech_item_id: str | None = None
        self.audio_in_ms = 0
        self.audio_ms_of: dict[str, int] = {}  # assistant item id -> its audio length

    async def send(self, message: JSON) -> None:
        await super().send({"event_id": self.up.new_id("event"), **message})

    async def on_open(self) -> None:
        self.start_timers()
        await self.send({"type": "session.created", "session": self.session})

    async def on_invalid(self, raw: str) -> None:
        await self.error("invalid_json", f"Invalid JSON: {raw}")

    async def error(self, code: str, message: str, event_id: str | None = None) -> None:
        error = {"type": "invalid_request_error", "code": code, "message": message}
        await self.send({"type": "error", "error": {**error, "param": None, "event_id": event_id}})

    async def expire(self) -> None:
        if self.output and self.output.task:
            self.output.task.cancel()
        await self.error("session_expired", SESSION_EXPIRED)
        await self.close(1000, "")

    async def on_message(self, message: JSON) -> None:
        handlers: dict[str, Callable[[JSON], Any]] = {
            "session.update": self.on_session_update,
            "input_audio_buffer.append": self.on_append,
            "input_audio_buffer.commit": self.on_commit,
            "input_audio_buffer.clear": self.on_clear,
            "conversation.item.create": self.on_item_create,
            "conversation.item.truncate": self.on_truncate,
            "response.create": self.on_response_create,
            "response.cancel": self.on_response_cancel,
        }
        handler = handlers.get(str(message.get("type")))
        if handler is None:
            kind = message.get("type")
            await self.error(
                "unknown_event", f"Unknown event type: {kind!r}", message.get("event_id")
            )
        else:
            await handler(message)

    # Session and input audio

    @property
    def turn_detection(self) -> JSON | None:
        detection: JSON | None = self.session["audio"]["input"].get("turn_detection")
        return detection

    @property
    def silence_ms(self) -> int:
        return int((self.turn_detection or {}).get("silence_duration_ms") or 500)

    async def on_session_update(self, message: JSON) -> None:
        self.session = deep_merge(self.session, message.get("session") or {})
        self.vad.silence_ms = self.silence_ms
        await self.send({"type": "session.updated", "session": self.session})

    async def on_append(self, message: JSON) -> None:
        pcm = base64.b64decode(message.get("audio", ""))
        self.buffer += pcm
        if self.turn_detection is None:
            return
        for event in self.vad.feed(pcm):
            if event.kind == "start":
                await self.on_speech_started(event.ms)
            else:
                await self.on_speech_stopped(event.ms)

    async def on_speech_started(self, ms: int) -> None:
        self.speech_item_id = self.up.new_id("item")
        started = {"audio_start_ms": ms, "item_id": self.speech_item_id}
        await self.send({"type": "input_audio_buffer.speech_started", **started})
        detection = self.turn_detection or {}
        if self.output and detection.get("interrupt_response", True):
            self.output.interrupt("turn_detected")

    async def on_speech_stopped(self, ms: int) -> None:
        item_id = self.speech_item_id or self.up.new_id("item")
        await self.send(
            {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms, "item_id": item_id}
        )
        await self.commit(item_id)
        if (self.turn_detection or {}).get("create_response", True) and self.output is None:
            self.start_response()

    async def on_commit(self, message: JSON) -> None:
        if not self.buffer:
            await self.error(
                "input_audio_buffer_commit_empty",
                "Error committing input audio buffer: buffer is empty.",
                message.get("event_id"),
            )
            return
        await self.commit(self.up.new_id("item"))

    async def on_clear(self, message: JSON) -> None:
        self.buffer.clear()
        self.vad.reset()
        await self.send({"type": "input_audio_buffer.cleared"})

    async def commit(self, item_id: str) -> None:
        pcm, self.buffer = bytes(self.buffer), bytearray()
        self.audio_in_ms += pcm_ms(pcm, OPENAI_INPUT_RATE)
        transcript = self.up.transcribe(pcm)
        previous = self.last_item_id
        await self.send(
            {
                "type": "input_audio_buffer.committed",
                "item_id": item_id,
                "previous_item_id": previous,
            }
        )
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": transcript}],
        }
        await self.add_item(item)
        if self.session["audio"]["input"].get("transcription"):
            await self.send(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": item_id,
                    "content_index": 0,
                    "transcript": transcript,
                    "usage": {"type": "duration", "seconds": pcm_ms(pcm, OPENAI_INPUT_RATE) / 1000},
                }
            )

    # Conversation items

    @property
    def last_item_id(self) -> str | None:
        return self.conn.history[-1]["id"] if self.conn.history else None

    async def add_item(self, item: JSON) -> None:
        previous = self.last_item_id
        self.conn.history.append(item)
        await self.send(
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item}
        )
        await self.send(
            {"type": "conversation.item.done", "previous_item_id": previous, "item": item}
        )

    async def on_item_create(self, message: JSON) -> None:
        item = {"object": "realtime.item", "status": "completed", **(message.get("item") or {})}
        item.setdefault("id", self.up.new_id("item"))
        if item.get("type") == "function_call_output":
            self.up.record_output(str(item.get("call_id")), item.get("output"))
        await self.add_item(item)

    async def on_truncate(self, message: JSON) -> None:
        item_id, end_ms = message.get("item_id"), int(message.get("audio_end_ms", 0))
        length = self.audio_ms_of.get(str(item_id))
        if length is None:
            await self.error("invalid_value", f"Item {item_id!r} has no audio to truncate.")
            return
        if end_ms > length:
            message_text = f"Audio content of {length}ms is already shorter than {end_ms}ms"
            await self.error("invalid_value", message_text, message.get("event_id"))
            return
        self.up.truncations.append(message)
        self.up.notify()
        content_index = message.get("content_index", 0)
        await self.send(
            {
                "type": "conversation.item.truncated",
                "item_id": item_id,
                "content_index": content_index,
                "audio_end_ms": end_ms,
            }
        )

    # Responses

    async def on_response_create(self, message: JSON) -> None:
        if self.output is not None:
            await self.error(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.output.id}.",
                message.get("event_id"),
            )
            return
        self.start_response()

    async def on_response_cancel(self, message: JSON) -> None:
        if self.output is None:
            await self.error(
                "response_cancel_not_active",
                "Cancellation failed: no active response found.",
                message.get("event_id"),
            )
            return
        self.output.interrupt("client_cancelled")

    def start_response(self) -> None:
        self.start_output(self.up.next_turn(), self.play)

    def response(self, output: ModelOutput, status: str, items: list[JSON]) -> JSON:
        return {
            "object": "realtime.response",
            "id": output.id,
            "status": status,
            "status_details": None,
            "output": items,
            "conversation_id": self.conversation_id,
            "output_modalities": self.session["output_modalities"],
            "max_output_tokens": "inf",
            "audio": {"output": self.session["audio"]["output"]},
            "usage": None,
            "metadata": None,
        }

    async def play(self, output: ModelOutput) -> None:
        await self.send(
            {"type": "response.created", "response": self.response(output, "in_progress", [])}
        )
        items: list[JSON] = []
        audio_ms = 0
        if output.turn.text:
            item, audio_ms = await self.play_message(output, len(items))
            items.append(item)
        for call in output.turn.calls:
            if output.reason:
                break
            items.append(await self.play_call(output, len(items), call))
        if output.turn.cancel_calls and output.turn.calls:
            output.interrupt("turn_detected")
        done = self.response(output, "cancelled" if output.reason else "completed", items)
        if output.reason:
            done["status_details"] = {"type": "cancelled", "reason": output.reason}
        done["usage"] = self.usage(items, audio_ms)
        self.output = None
        await self.send({"type": "response.done", "response": done})
        if self.count_response():
            await self.expire()

    async def play_message(self, output: ModelOutput, index: int) -> tuple[JSON, int]:
        text_only = "audio" not in self.session["output_modalities"]
        item_id = self.up.new_id("item")
        item: JSON = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        where = {"response_id": output.id, "item_id": item_id, "output_index": index}
        part: JSON = (
            {"type": "text", "text": ""} if text_only else {"type": "audio", "transcript": ""}
        )
        await self.open_item(output, index, item)
        await self.send(
            {"type": "response.content_part.added", **where, "content_index": 0, "part": part}
        )
        text = output.turn.text
        pcm = b"" if text_only else self.up.synthesize(text, OUTPUT_RATE)
        said, audio = "", b""
        for piece, chunk in self.chunks(text, pcm):
            if output.reason:
                break
            said += piece
            if text_only:
                delta = {"type": "response.output_text.delta", "delta": piece}
                await self.send({**delta, **where, "content_index": 0})
            else:
                if piece:  # a synthesizer may give more chunks than characters
                    delta = {"type": "response.output_audio_transcript.delta", "delta": piece}
                    await self.send({**delta, **where, "content_index": 0})
                audio += chunk
                self.audio_ms_of[item_id] = pcm_ms(audio, OUTPUT_RATE)
                delta = {"type": "response.output_audio.delta", "delta": b64(chunk)}
                await self.send({**delta, **where, "content_index": 0})
            await self.pace(output, self.up.chunk_ms)
        if text_only:
            part = {"type": "text", "text": said}
            await self.send(
                {"type": "response.output_text.done", **where, "content_index": 0, "text": said}
            )
        else:
            part = {"type": "audio", "transcript": said}
            await self.send({"type": "response.output_audio.done", **where, "content_index": 0})
            done = {"type": "response.output_audio_transcript.done", "transcript": said}
            await self.send({**done, **where, "content_index": 0})
        await self.send(
            {"type": "response.content_part.done", **where, "content_index": 0, "part": part}
        )
        content = (
            {"type": "output_text", "text": said}
            if text_only
            else {"type": "output_audio", "transcript": said}
        )
        item |= {"status": "incomplete" if output.reason else "completed", "content": [content]}
        await self.close_item(output, index, item)
        return item, pcm_ms(audio, OUTPUT_RATE)

    async def play_call(self, output: ModelOutput, index: int, call: ScriptedCall) -> JSON:
        call_id = call.call_id or self.up.new_id("call")
        arguments = json.dumps(call.arguments)
        item: JSON = {
            "id": self.up.new_id("item"),
            "object": "realtime.item",
            "type": "function_call",
            "status": "in_progress",
            "name": call.name,
            "call_id": call_id,
            "arguments": "",
        }
        where = {"response_id": output.id, "item_id": item["id"], "output_index": index}
        await self.open_item(output, index, item)
        await self.send(
            {
                "type": "response.function_call_arguments.delta",
                **where,
                "call_id": call_id,
                "delta": arguments,
            }
        )
        await self.send(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "call_id": call_id,
                "name": call.name,
                "arguments": arguments,
            }
        )
        cancelled = output.turn.cancel_calls or output.reason is not None
        if cancelled:
            self.up.cancelled_call_ids.add(call_id)
        item |= {"status": "incomplete" if cancelled else "completed", "arguments": arguments}
        await self.close_item(output, index, item)
        return item

    async def open_item(self, output: ModelOutput, index: int, item: JSON) -> None:
        previous = self.last_item_id
        self.conn.history.append(item)
        added = {"type": "response.output_item.added", "response_id": output.id}
        await self.send({**added, "output_index": index, "item": item})
        await self.send(
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item}
        )

    async def close_item(self, output: ModelOutput, index: int, item: JSON) -> None:
        done = {"type": "response.output_item.done", "response_id": output.id}
        await self.send({**done, "output_index": index, "item": item})
        await self.send({"type": "conversation.item.done", "item": item})

    def usage(self, items: list[JSON], audio_out_ms: int) -> JSON:
        """Plausible counts: 1 audio token per 100 ms heard, per 50 ms spoken; 4 chars a token."""
        context = [item for item in self.conn.history if item not in items]
        heard = " ".join([self.session.get("instructions") or "", *map(item_text, context)])
        said = " ".join(map(item_text, items))
        inputs = {"text_tokens": text_tokens(heard), "audio_tokens": self.audio_in_ms // 100}
        outputs = {"text_tokens": text_tokens(said), "audio_tokens": audio_out_ms // 50}
        input_tokens, output_tokens = sum(inputs.values()), sum(outputs.values())
        return {
            "total_tokens": input_tokens + output_tokens,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "input_token_details": {**inputs, "cached_tokens": 0, "image_tokens": 0},
            "output_token_details": outputs,
        }


def item_text(item: JSON) -> str:
    """The words of an item: its texts and transcripts, a call's arguments, an output."""
    words = [part.get("text") or part.get("transcript") or "" for part in item.get("content") or []]
    words += [item.get("arguments") or "", str(item.get("output") or "")]
    return " ".join(w for w in words if w)


def model_in(path: str) -> str:
    """The model a client asks for in the URL (``/v1/realtime?model=...``)."""
    return parse_qs(urlsplit(path).query).get("model", ["gpt-realtime"])[0]

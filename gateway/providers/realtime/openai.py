"""The OpenAI Realtime adapter (GA protocol): one WebSocket session per conversation.

It speaks to ``{base_url}/realtime?model=...`` (``wss://api.openai.com/v1`` for OpenAI, or
any server of the same protocol: this gateway's own ``/v1/openai`` endpoint, say) and
configures the session so that the gateway stays in charge: the model's VAD hears the user
(``server_vad``) but neither answers nor stops by itself (``create_response`` and
``interrupt_response`` off): the gateway asks for each response (``respond``) and decides
when the user's speech is a barge-in (``cancel``, ``truncate``). Transcription of the user's
audio is on, for the gateway's history.

Server events become the neutral events of ``gateway.providers.realtime.upstream``; what has
no counterpart there (item bookkeeping, rate limits) is dropped. An ``error`` with code
``session_expired`` (OpenAI ends every session at 60 minutes) marks the coming close as
``expired``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import structlog
import websockets
from websockets.asyncio.client import ClientConnection, connect

from gateway.core.transcript import AssistantTurn, ContextNote, Item, ToolOutcome, UserTurn
from gateway.errors import ProviderError
from gateway.providers.realtime.upstream import (
    AudioDelta,
    CallRequested,
    Closed,
    Committed,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TurnDone,
    TurnStarted,
    UpstreamEvent,
    UpstreamSetup,
    UpstreamUsage,
    UserTranscript,
)

__all__ = ["OpenAIRealtimeUpstream", "context_text"]

log = structlog.get_logger("gateway.providers.realtime")

RATE = 24000
TRANSCRIPTION_MODEL = "gpt-4o-mini-transcribe"
_PCM = {"type": "audio/pcm", "rate": RATE}


def context_text(text: str) -> str:
    """How a note the model should have, said by no one, reads in its conversation."""
    return f"<context>{text}</context>"


class OpenAIRealtimeUpstream:
    """One OpenAI Realtime session; see the module docstring and ``Upstream``."""

    input_rate = RATE
    output_rate = RATE
    answers_speech = False  # configured so: the gateway asks for each response

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        connect_timeout: float = 10.0,
        transcription_model: str = TRANSCRIPTION_MODEL,
    ) -> None:
        base = base_url.rstrip("/")
        if base.startswith("http"):
            base = "ws" + base[4:]
        self.url = f"{base}/realtime?{urlencode({'model': model})}"
        self._api_key = api_key
        self._connect_timeout = connect_timeout
        self._transcription_model = transcription_model
        self._ws: ClientConnection | None = None
        self._expired = False
        self._responding = False
        self._audio_item: str | None = None
        """The latest response's audio item: the one ``truncate`` cuts."""
        self._audio_ms = 0.0
        """Milliseconds of that item's audio received."""

    # ----------------------------------------------------------------- opening

    async def open(self, setup: UpstreamSetup) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            async with asyncio.timeout(self._connect_timeout):
                self._ws = await connect(
                    self.url, additional_headers=headers, max_size=2**24, compression=None
                )
                await self._expect("session.created")
                await self._send({"type": "session.update", "session": self._session(setup)})
                await self._expect("session.updated")
        except (OSError, TimeoutError, websockets.WebSocketException) as exc:
            await self.aclose()
            raise ProviderError(
                f"realtime upstream {self.url}: {exc or type(exc).__name__}"
            ) from exc
        for item in _seed_items(setup.history):
            await self._send({"type": "conversation.item.create", "item": item})

    def _session(self, setup: UpstreamSetup) -> dict[str, Any]:
        output: dict[str, Any] = {"format": _PCM}
        if setup.voice:
            output["voice"] = setup.voice
        return {
            "type": "realtime",
            "output_modalities": ["audio"],
            "instructions": setup.instructions,
            "tools": [{"type": "function", **tool} for tool in setup.tools],
            "tool_choice": "auto",
            "audio": {
                "input": {
                    "format": _PCM,
                    "transcription": {"model": self._transcription_model},
                    "turn_detection": {
                        "type": "server_vad",
                        "silence_duration_ms": setup.silence_ms,
                        "create_response": False,
                        "interrupt_response": False,
                    },
                },
                "output": output,
            },
        }

    async def _expect(self, kind: str) -> None:
        """Read events until one of ``kind``; an ``error`` first fails the opening."""
        assert self._ws is not None
        while True:
            event = json.loads(await self._ws.recv())
            if event.get("type") == kind:
                return
            if event.get("type") == "error":
                message = event.get("error", {}).get("message", "error")
                raise ProviderError(f"realtime upstream refused the session: {message}")

    # ----------------------------------------------------------------- what the model says

    async def events(self) -> AsyncIterator[UpstreamEvent]:
        ws = self._ws
        assert ws is not None, "open() first"
        reason = "closed"
        try:
            async for frame in ws:
                for event in self._translate(json.loads(frame)):
                    yield event
        except websockets.ConnectionClosed as exc:
            reason = f"{exc.rcvd.code if exc.rcvd else 1006} {exc.rcvd.reason if exc.rcvd else ''}"
        else:
            close = ws.protocol.close_rcvd
            reason = f"{close.code} {close.reason}" if close is not None else "closed"
        yield Closed(reason.strip(), expired=self._expired)

    def _translate(self, event: dict[str, Any]) -> list[UpstreamEvent]:
        kind = event.get("type", "")
        match kind:
            case "response.output_audio.delta":
                pcm = base64.b64decode(event.get("delta", ""))
                self._audio_ms += len(pcm) * 1000 / (2 * RATE)
                return [AudioDelta(pcm)]
            case "response.output_audio_transcript.delta" | "response.output_text.delta":
                return [TextDelta(event.get("delta", ""))]
            case "input_audio_buffer.speech_started":
                return [SpeechStarted(int(event.get("audio_start_ms", 0)))]
            case "input_audio_buffer.speech_stopped":
                return [SpeechStopped(int(event.get("audio_end_ms", 0)))]
            case "input_audio_buffer.committed":
                return [Committed()]
            case "conversation.item.input_audio_transcription.completed":
                return [UserTranscript(event.get("transcript") or "")]
            case "conversation.item.input_audio_transcription.failed":
                error = event.get("error") or {}
                log.warning("realtime_transcription_failed", message=error.get("message"))
                return [UserTranscript("")]  # not heard: no answer, as for silence
            case "response.created":
                self._responding = True
                return [TurnStarted()]
            case "response.output_item.added":
                item = event.get("item", {})
                if item.get("type") == "message":
                    self._audio_item, self._audio_ms = item.get("id"), 0.0
                return []
            case "response.output_item.done":
                return _call_of(event.get("item", {}))
            case "response.done":
                self._responding = False
                return [_turn_done(event.get("response", {}))]
            case "error":
                error = event.get("error", {})
                if error.get("code") == "session_expired":
                    self._expired = True
                log.warning(
                    "realtime_upstream_error", code=error.get("code"), message=error.get("message")
                )
                return []
        return []

    # ----------------------------------------------------------------- what the gateway says

    async def send_audio(self, pcm: bytes) -> None:
        audio = base64.b64encode(pcm).decode("ascii")
        await self._send({"type": "input_audio_buffer.append", "audio": audio})

    async def commit_audio(self) -> None:
        await self._send({"type": "input_audio_buffer.commit"})

    async def clear_audio(self) -> None:
        await self._send({"type": "input_audio_buffer.clear"})

    async def send_user_text(self, text: str) -> None:
        await self._create(_message("user", "input_text", text))

    async def send_context(self, text: str) -> None:
        await self._create(_message("system", "input_text", context_text(text)))

    async def send_tool_output(self, call_id: str, name: str, output: Any) -> None:
        await self._create(_output(call_id, output))

    async def respond(self) -> None:
        await self._send({"type": "response.create"})

    async def cancel(self) -> None:
        if self._responding:
            await self._send({"type": "response.cancel"})

    async def truncate(self, audio_end_ms: int) -> None:
        if self._audio_item is None:
            return
        end = int(min(audio_end_ms, self._audio_ms))
        await self._send(
            {
                "type": "conversation.item.truncate",
                "item_id": self._audio_item,
                "content_index": 0,
                "audio_end_ms": end,
            }
        )

    async def _create(self, item: dict[str, Any]) -> None:
        await self._send({"type": "conversation.item.create", "item": item})

    async def _send(self, event: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None:
            raise ProviderError("realtime upstream: not open")
        try:
            await ws.send(json.dumps(event))
        except websockets.ConnectionClosed as exc:
            raise ProviderError(f"realtime upstream closed: {exc}") from exc

    async def aclose(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()


def _message(role: str, part: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def _output(call_id: str, output: Any) -> dict[str, Any]:
    text = output if isinstance(output, str) else json.dumps(output)
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def _seed_items(history: tuple[Item, ...]) -> list[dict[str, Any]]:
    """The conversation so far as OpenAI items, for a replacement session."""
    items: list[dict[str, Any]] = []
    for item in history:
        match item:
            case UserTurn(text=text):
                items.append(_message("user", "input_text", text))
            case AssistantTurn(text=text, calls=calls):
                if text:
                    items.append(_message("assistant", "output_text", text))
                for call in calls:
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": call.call_id,
                            "name": call.name,
                            "arguments": json.dumps(call.args),
                        }
                    )
            case ToolOutcome():
                items.append(
                    _output(
                        item.call_id, item.output if item.error is None else {"error": item.error}
                    )
                )
            case ContextNote(text=text):
                items.append(_message("system", "input_text", context_text(text)))
    return items


def _call_of(item: dict[str, Any]) -> list[UpstreamEvent]:
    if item.get("type") != "function_call":
        return []
    raw = item.get("arguments") or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        return [CallRequested(item.get("call_id", ""), item.get("name", ""), {}, str(exc))]
    if not isinstance(args, dict):
        return [CallRequested(item.get("call_id", ""), item.get("name", ""), {}, "not an object")]
    return [CallRequested(item.get("call_id", ""), item.get("name", ""), args)]


def _turn_done(response: dict[str, Any]) -> TurnDone:
    status = response.get("status", "completed")
    usage = response.get("usage") or {}
    input_details = usage.get("input_token_details") or {}
    output_details = usage.get("output_token_details") or {}
    counted = UpstreamUsage(
        input_text_tokens=int(input_details.get("text_tokens") or 0),
        input_audio_tokens=int(input_details.get("audio_tokens") or 0),
        output_text_tokens=int(output_details.get("text_tokens") or 0),
        output_audio_tokens=int(output_details.get("audio_tokens") or 0),
    )
    if status in ("completed", "incomplete"):
        return TurnDone("completed", counted)
    if status == "cancelled":
        return TurnDone("cancelled", counted)
    error = (response.get("status_details") or {}).get("error") or {}
    return TurnDone("failed", counted, error.get("message") or status)

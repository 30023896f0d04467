"""Gemini Live, v1beta ``BidiGenerateContent``: the session of one connection.

camelCase JSON as google's python-genai sends and parses it (``LiveClientMessage``,
``LiveServerMessage`` in ``google/genai/types.py``).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection

from tests.realtime_upstream.session import (
    JSON,
    Connection,
    ModelOutput,
    RealtimeSession,
    Turn,
    b64,
    text_tokens,
)
from tests.realtime_upstream.vad import OUTPUT_RATE, EnergyVad, pcm_ms

if TYPE_CHECKING:
    from tests.realtime_upstream import RealtimeUpstream

GEMINI_INPUT_RATE = 16000
# Gemini's own closes, as seen in the wild: a cap without warning, an unknown resumption handle.
GEMINI_ABORTED = (1008, "The operation was aborted.")
GEMINI_UNKNOWN_HANDLE = (1008, "Requested entity was not found.")
GEMINI_GOAWAY_CLOSE = (1000, "Session time limit reached.")


class GeminiSession(RealtimeSession):
    def __init__(self, upstream: RealtimeUpstream, ws: ServerConnection, conn: Connection) -> None:
        super().__init__(upstream, ws, conn)
        self.setup: JSON | None = None
        self.vad = EnergyVad(GEMINI_INPUT_RATE, upstream.vad_threshold, 500)
        self.utterance = bytearray()
        self.pending_calls: dict[str, str] = {}  # call id -> function name
        self.audio_in_ms = 0
        self.goaway_sent = False

    async def send(self, message: JSON) -> None:
        frame = json.dumps(message)
        await self.send_frame(frame.encode() if self.up.gemini_binary_frames else frame)

    async def on_invalid(self, raw: str) -> None:
        await self.close(1007, f"Invalid JSON payload received: {raw}")

    async def expire(self) -> None:
        await self.close(*GEMINI_ABORTED)

    async def on_message(self, message: JSON) -> None:
        if self.setup is None:
            await self.on_setup(message)
        elif "realtimeInput" in message:
            await self.on_realtime_input(message["realtimeInput"])
        elif "clientContent" in message:
            await self.on_client_content(message["clientContent"])
        elif "toolResponse" in message:
            await self.on_tool_response(message["toolResponse"])
        else:
            await self.close(
                1007, f"Invalid JSON payload received. Unknown name {next(iter(message), '')!r}"
            )

    async def on_setup(self, message: JSON) -> None:
        if "setup" not in message:
            await self.close(1007, "The first message must be setup.")
            return
        self.setup = message["setup"]
        handle = (self.setup.get("sessionResumption") or {}).get("handle")
        if handle:
            if handle not in self.up.gemini_handles:
                await self.close(*GEMINI_UNKNOWN_HANDLE)
                return
            self.conn.history = copy.deepcopy(self.up.gemini_handles[handle])
        self.vad.silence_ms = int(self.activity_detection.get("silenceDurationMs") or 500)
        await self.send({"setupComplete": {}})
        self.start_timers()
        if self.up.goaway_after_s is not None:
            self.spawn(self._goaway_after(self.up.goaway_after_s))

    @property
    def activity_detection(self) -> JSON:
        assert self.setup is not None
        input_config = self.setup.get("realtimeInputConfig") or {}
        detection: JSON = input_config.get("automaticActivityDetection") or {}
        return detection

    @property
    def manual_activity(self) -> bool:
        """The client marks speech with ``activityStart``/``activityEnd``: no VAD here."""
        return bool(self.activity_detection.get("disabled"))

    def wants(self, key: str) -> bool:
        """Whether setup asked for an optional feature (``inputAudioTranscription``...)."""
        return self.setup is not None and self.setup.get(key) is not None

    @property
    def speaks(self) -> bool:
        assert self.setup is not None
        config = self.setup.get("generationConfig") or {}
        modalities = config.get("responseModalities") or ["AUDIO"]
        return "AUDIO" in [str(m).upper() for m in modalities]

    # User input

    async def on_realtime_input(self, realtime: JSON) -> None:
        blobs = [realtime["audio"]] if "audio" in realtime else realtime.get("mediaChunks") or []
        for blob in blobs:
            pcm = base64.b64decode(blob.get("data", ""))
            self.utterance += pcm
            if not self.manual_activity:
                for event in self.vad.feed(pcm):
                    await (
                        self.on_speech_started()
                        if event.kind == "start"
                        else self.on_speech_stopped()
                    )
        if realtime.get("audioStreamEnd") and self.vad.flush():
            await self.on_speech_stopped()
        if "activityStart" in realtime:
            await self.on_speech_started()
        if "activityEnd" in realtime:
            await self.on_speech_stopped()
        if realtime.get("text"):
            await self.interrupt()
            self.conn.history.append({"role": "user", "parts": [{"text": realtime["text"]}]})
            self.start_model_turn()

    async def on_speech_started(self) -> None:
        """Barge-in: stop the model's turn and, as Gemini does, cancel calls still pending."""
        await self.interrupt()
        if self.pending_calls and self.up.cancel_calls_on_barge_in:
            await self.cancel_calls()

    async def on_speech_stopped(self) -> None:
        pcm, self.utterance = bytes(self.utterance), bytearray()
        self.audio_in_ms += pcm_ms(pcm, GEMINI_INPUT_RATE)
        transcript = self.up.transcribe(pcm)
        if self.wants("inputAudioTranscription"):
            await self.send({"serverContent": {"inputTranscription": {"text": transcript}}})
        self.conn.history.append({"role": "user", "parts": [{"text": transcript}]})
        self.start_model_turn()

    async def on_client_content(self, content: JSON) -> None:
        await self.interrupt()
        self.conn.history += content.get("turns") or []
        if content.get("turnComplete"):
            self.start_model_turn()

    async def on_tool_response(self, response: JSON) -> None:
        answered = False
        for reply in response.get("functionResponses") or []:
            call_id = str(reply.get("id"))
            self.up.record_output(call_id, reply.get("response"))
            if self.pending_calls.pop(call_id, None) is not None:
                answered = True
                self.conn.history.append({"role": "user", "parts": [{"functionResponse": reply}]})
        if answered and not self.pending_calls:
            self.start_model_turn()

    async def interrupt(self) -> None:
        if self.output is not None and not self.output.stopped.is_set():
            self.output.interrupt("interrupted")
            await self.send({"serverContent": {"interrupted": True}})

    async def cancel_calls(self) -> None:
        ids = list(self.pending_calls)
        self.pending_calls.clear()
        self.up.cancelled_call_ids.update(ids)
        await self.send({"toolCallCancellation": {"ids": ids}})

    # Model turns

    def start_model_turn(self) -> None:
        self.start_output(self.up.next_turn(), self.play)

    async def play(self, output: ModelOutput) -> None:
        """Words, then calls; the turn ends unless calls wait for outputs or it was interrupted
        (``interrupted`` was sent then, and the turn stops there)."""
        turn, audio_ms, context = output.turn, 0, len(self.conn.history)
        if turn.text:
            audio_ms = await self.play_words(output)
        if output.reason is None:
            if turn.calls:
                await self.play_calls(turn)
            if not turn.calls or turn.cancel_calls:
                self.output = None
                usage = self.usage(self.conn.history[:context], turn, audio_ms)
                await self.send({"serverContent": {"generationComplete": True}})
                await self.send({"serverContent": {"turnComplete": True}, "usageMetadata": usage})
        if self.wants("sessionResumption") and not self.pending_calls:
            handle = self.up.new_id("handle")
            self.up.gemini_handles[handle] = copy.deepcopy(self.conn.history)
            await self.send({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})
        await self.turn_played()

    async def play_words(self, output: ModelOutput) -> int:
        text = output.turn.text
        pcm = self.up.synthesize(text, OUTPUT_RATE) if self.speaks else b""
        said, audio_ms = "", 0
        for piece, chunk in self.chunks(text, pcm):
            if output.reason:
                break
            said += piece
            if self.speaks:
                audio_ms += pcm_ms(chunk, OUTPUT_RATE)
                blob = {"mimeType": f"audio/pcm;rate={OUTPUT_RATE}", "data": b64(chunk)}
                await self.send({"serverContent": {"modelTurn": {"parts": [{"inlineData": blob}]}}})
                if piece and self.wants("outputAudioTranscription"):
                    await self.send({"serverContent": {"outputTranscription": {"text": piece}}})
            else:
                await self.send({"serverContent": {"modelTurn": {"parts": [{"text": piece}]}}})
            await self.pace(output, self.up.chunk_ms)
        self.conn.history.append({"role": "model", "parts": [{"text": said}]})
        return audio_ms

    async def play_calls(self, turn: Turn) -> None:
        calls: list[JSON] = [
            {"id": c.call_id or self.up.new_id("call"), "name": c.name, "args": c.arguments}
            for c in turn.calls
        ]
        self.pending_calls.update({c["id"]: c["name"] for c in calls})
        self.conn.history.append({"role": "model", "parts": [{"functionCall": c} for c in calls]})
        self.output = None
        await self.send({"toolCall": {"functionCalls": calls}})
        if turn.cancel_calls:
            await self.cancel_calls()

    async def turn_played(self) -> None:
        capped = self.count_response()
        after = self.up.goaway_after_responses
        if after is not None and self.conn.responses >= after:
            await self.go_away()
        elif capped:
            await self.expire()

    async def go_away(self) -> None:
        if self.goaway_sent:
            return
        self.goaway_sent = True
        await self.send({"goAway": {"timeLeft": f"{self.up.goaway_time_left_s:g}s"}})
        self.spawn(self._close_after(self.up.goaway_time_left_s))

    async def _close_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.close(*GEMINI_GOAWAY_CLOSE)

    async def _goaway_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.go_away()

    def usage(self, context: list[JSON], turn: Turn, audio_out_ms: int) -> JSON:
        """Plausible counts: 25 audio tokens a second (Gemini's rate), 4 characters a token."""
        prompt = {
            "TEXT": text_tokens(json.dumps(context)),
            "AUDIO": self.audio_in_ms // 40,
        }
        reply = (
            {"TEXT": 0, "AUDIO": audio_out_ms // 40}
            if self.speaks
            else {"TEXT": text_tokens(turn.text)}
        )
        prompt_count, reply_count = sum(prompt.values()), sum(reply.values())
        return {
            "promptTokenCount": prompt_count,
            "responseTokenCount": reply_count,
            "totalTokenCount": prompt_count + reply_count,
            "promptTokensDetails": [{"modality": m, "tokenCount": n} for m, n in prompt.items()],
            "responseTokensDetails": [
                {"modality": m, "tokenCount": n} for m, n in reply.items() if n
            ],
        }

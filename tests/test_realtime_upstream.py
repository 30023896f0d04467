"""The scripted realtime upstream (tests/realtime_upstream/), driven by a plain client."""

from __future__ import annotations

import asyncio
import base64
import json
import math
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.realtime_upstream import (
    MS_PER_CHAR,
    SESSION_EXPIRED,
    Call,
    RealtimeUpstream,
    Say,
    tone,
)

JSON = dict[str, Any]
ANSWER = "It is at 80 percent."
OPENAI_EVENTS: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


def assert_healthy(upstream: RealtimeUpstream) -> None:
    """No failure inside the upstream, and every OpenAI event it sent has the shape
    openai-python's realtime types require (the gateway's client parses with them)."""
    assert upstream.failures == []
    for connection in upstream.connections:
        if connection.protocol == "openai":
            for event in connection.sent:
                OPENAI_EVENTS.validate_python(event)


def speech(ms: int, rate: int) -> bytes:
    """A loud 300 Hz tone: the upstream's energy VAD hears it as speech."""
    count = rate * ms // 1000
    return array(
        "h", (int(8000 * math.sin(2 * math.pi * 300 * i / rate)) for i in range(count))
    ).tobytes()


def silence(ms: int, rate: int) -> bytes:
    return bytes(rate * ms // 1000 * 2)


def utterance(rate: int, speech_ms: int = 400, silence_ms: int = 600) -> list[bytes]:
    """Speech then silence in 100 ms chunks, as a microphone would send them."""
    audio = speech(speech_ms, rate) + silence(silence_ms, rate)
    size = rate // 10 * 2
    return [audio[i : i + size] for i in range(0, len(audio), size)]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def matches(event: JSON, kind: str) -> bool:
    """An OpenAI ``type``, or a dotted Gemini path whose value is present and truthy."""
    if "type" in event:
        return bool(event["type"] == kind)
    value: Any = event
    for key in kind.split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return value is not None and value is not False


class Client:
    """A plain client: JSON out, parsed events in, each wait bounded."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[str | bytes] = []
        self.events: list[JSON] = []

    async def send(self, message: JSON) -> None:
        await self.ws.send(json.dumps(message))

    async def recv(self) -> JSON:
        frame = await asyncio.wait_for(self.ws.recv(), 5)
        self.frames.append(frame)
        event: JSON = json.loads(frame)
        self.events.append(event)
        return event

    async def until(self, kind: str) -> list[JSON]:
        """Every event up to and including the first of ``kind``."""
        events = [await self.recv()]
        while not matches(events[-1], kind):
            events.append(await self.recv())
        return events

    async def closed(self) -> ConnectionClosed:
        """The close, once every event before it is read."""
        try:
            while True:
                await self.recv()
        except ConnectionClosed as closed:
            return closed


@asynccontextmanager
async def client(url: str) -> AsyncIterator[Client]:
    async with connect(url) as ws:
        yield Client(ws)


def of(events: list[JSON], kind: str) -> list[JSON]:
    return [e for e in events if matches(e, kind)]


# --- OpenAI Realtime ------------------------------------------------------------------------


async def test_openai_spoken_turn_detects_speech_and_answers_with_synthesized_audio() -> None:
    async with (
        RealtimeUpstream([Say(ANSWER)], transcripts=["what is my battery level"]) as upstream,
        client(upstream.openai_url + "?model=gpt-realtime-mini") as c,
    ):
        created = await c.recv()
        session = created["session"]
        assert (created["type"], session["model"]) == ("session.created", "gpt-realtime-mini")
        assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await c.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {"input": {"transcription": {"model": "whisper-1"}}},
                },
            }
        )
        updated = (await c.until("session.updated"))[-1]["session"]
        assert updated["audio"]["input"]["transcription"] == {"model": "whisper-1"}
        assert updated["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500

        for chunk in utterance(24000):
            await c.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
        events = await c.until("response.done")

        kinds = [e["type"] for e in events]
        started, stopped = (
            of(events, "input_audio_buffer.speech_started")[0],
            of(events, "input_audio_buffer.speech_stopped")[0],
        )
        assert (started["audio_start_ms"], stopped["audio_end_ms"]) == (0, 400)
        committed = of(events, "input_audio_buffer.committed")[0]
        assert committed["item_id"] == started["item_id"] == stopped["item_id"]
        user_item = of(events, "conversation.item.done")[0]["item"]
        assert user_item["role"] == "user"
        assert user_item["content"] == [
            {"type": "input_audio", "transcript": "what is my battery level"}
        ]
        transcription = of(events, "conversation.item.input_audio_transcription.completed")[0]
        assert transcription["transcript"] == "what is my battery level"
        assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")

        audio = b"".join(
            base64.b64decode(e["delta"]) for e in of(events, "response.output_audio.delta")
        )
        assert audio == tone(ANSWER, 24000)
        assert len(audio) == len(ANSWER) * MS_PER_CHAR * 48  # 24 kHz PCM16: 48 bytes a ms
        transcript = "".join(
            e["delta"] for e in of(events, "response.output_audio_transcript.delta")
        )
        assert (
            transcript
            == ANSWER
            == of(events, "response.output_audio_transcript.done")[0]["transcript"]
        )
        done = events[-1]["response"]
        assert done["status"] == "completed"
        assert done["output"][0]["content"] == [{"type": "output_audio", "transcript": ANSWER}]
        usage = done["usage"]
        assert usage["output_token_details"]["audio_tokens"] == len(ANSWER) * MS_PER_CHAR // 50
        # Committed when 500 ms of silence ended the speech: 900 ms heard, 1 token per 100 ms.
        assert usage["input_token_details"]["audio_tokens"] == 9
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert len(upstream.received("input_audio_buffer.append")) == 10
        assert_healthy(upstream)


async def test_openai_function_call_then_output_then_answer() -> None:
    script = [Call("get_battery_level", {"device": "phone"}, call_id="call_1"), Say(ANSWER)]
    async with RealtimeUpstream(script) as upstream, client(upstream.openai_url) as c:
        await c.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "output_modalities": ["text"]},
            }
        )
        await c.until("session.updated")
        user = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "battery?"}],
        }
        await c.send({"type": "conversation.item.create", "item": user})
        await c.send({"type": "response.create"})
        events = await c.until("response.done")
        arguments = of(events, "response.function_call_arguments.done")[0]
        assert (arguments["call_id"], arguments["name"]) == ("call_1", "get_battery_level")
        assert json.loads(arguments["arguments"]) == {"device": "phone"}
        call_item = events[-1]["response"]["output"][0]
        assert (call_item["type"], call_item["status"], call_item["call_id"]) == (
            "function_call",
            "completed",
            "call_1",
        )

        output = {"type": "function_call_output", "call_id": "call_1", "output": '{"level": 80}'}
        await c.send({"type": "conversation.item.create", "item": output})
        await c.send({"type": "response.create"})
        events = await c.until("response.done")
        assert "".join(e["delta"] for e in of(events, "response.output_text.delta")) == ANSWER
        assert not of(events, "response.output_audio.delta")
        assert events[-1]["response"]["output"][0]["content"] == [
            {"type": "output_text", "text": ANSWER}
        ]
        assert upstream.function_outputs == {"call_1": ['{"level": 80}']}
        assert upstream.turns_played == 2
        assert_healthy(upstream)


async def test_openai_barge_in_cancels_the_response_and_truncation_is_recorded() -> None:
    long_answer = "Once upon a time there was a very long story."  # 2.7 s at real-time pace
    script = [Say(long_answer), Say("Sure.")]
    async with (
        RealtimeUpstream(script, transcripts=["stop"], realtime=True) as upstream,
        client(upstream.openai_url) as c,
    ):
        await c.send({"type": "response.create"})
        first = (await c.until("response.output_audio.delta"))[-1]
        await c.send({"type": "response.create"})
        error = (await c.until("error"))[-1]["error"]
        assert error["code"] == "conversation_already_has_active_response"

        for chunk in utterance(24000, speech_ms=200, silence_ms=0):
            await c.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
        events = await c.until("response.done")
        assert of(events, "input_audio_buffer.speech_started")
        cancelled = events[-1]["response"]
        assert cancelled["status"] == "cancelled"
        assert cancelled["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        assert cancelled["output"][0]["status"] == "incomplete"
        heard = of(c.events, "response.output_audio.delta")
        assert len(heard) < len(tone(long_answer, 24000)) // 4800  # stopped well before the end

        await c.send(
            {
                "type": "conversation.item.truncate",
                "item_id": first["item_id"],
                "content_index": 0,
                "audio_end_ms": 100,
            }
        )
        truncated = (await c.until("conversation.item.truncated"))[-1]
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (first["item_id"], 100)
        assert [t["audio_end_ms"] for t in upstream.truncations] == [100]

        for chunk in utterance(24000, speech_ms=0, silence_ms=600):
            await c.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
        events = await c.until("response.done")
        assert of(events, "conversation.item.done")[0]["item"]["content"][0]["transcript"] == "stop"
        assert events[-1]["response"]["status"] == "completed"
        assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == "Sure."
        assert_healthy(upstream)


async def test_openai_response_cancel_and_manual_commit() -> None:
    async with (
        RealtimeUpstream([Say("A fairly long answer, cut.")], realtime=True) as upstream,
        client(upstream.openai_url) as c,
    ):
        await c.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
        )
        await c.until("session.updated")
        await c.send({"type": "input_audio_buffer.commit"})
        assert (await c.until("error"))[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
        await c.send({"type": "input_audio_buffer.append", "audio": b64(speech(300, 24000))})
        await c.send({"type": "input_audio_buffer.clear"})
        events = await c.until("input_audio_buffer.cleared")
        assert not of(events, "input_audio_buffer.speech_started")  # no VAD without turn detection
        await c.send({"type": "input_audio_buffer.append", "audio": b64(speech(300, 24000))})
        await c.send({"type": "input_audio_buffer.commit"})
        events = await c.until("conversation.item.done")
        assert of(events, "input_audio_buffer.committed")

        await c.send({"type": "response.create"})
        await c.until("response.output_audio.delta")
        await c.send({"type": "response.cancel"})
        done = (await c.until("response.done"))[-1]["response"]
        assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        await c.send({"type": "response.cancel"})
        assert (await c.until("error"))[-1]["error"]["code"] == "response_cancel_not_active"
        await c.send({"type": "no.such.event"})
        assert (await c.until("error"))[-1]["error"]["type"] == "invalid_request_error"
        assert_healthy(upstream)


@pytest.mark.parametrize("cap", [{"max_responses": 1}, {"max_session_s": 0.2}])
async def test_openai_session_cap_closes_with_session_expired(cap: dict[str, Any]) -> None:
    async with RealtimeUpstream([Say("Hi.")], **cap) as upstream, client(upstream.openai_url) as c:
        if "max_responses" in cap:
            await c.send({"type": "response.create"})
            await c.until("response.done")
        error = (await c.until("error"))[-1]["error"]
        assert (error["code"], error["message"]) == ("session_expired", SESSION_EXPIRED)
        await c.closed()
        await upstream.wait_for(lambda: upstream.connections[0].closed)
        assert upstream.connections[0].close_code == 1000
        assert_healthy(upstream)


# --- Gemini Live ----------------------------------------------------------------------------

SETUP: JSON = {
    "setup": {
        "model": "models/gemini-live-2.5-flash-preview",
        "generationConfig": {"responseModalities": ["AUDIO"], "speechConfig": {}},
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [{"name": "get_battery_level"}]}],
        "inputAudioTranscription": {},
        "outputAudioTranscription": {},
    }
}


def setup(**extra: Any) -> JSON:
    return {"setup": {**SETUP["setup"], **extra}}


def realtime_audio(chunk: bytes) -> JSON:
    return {"realtimeInput": {"audio": {"data": b64(chunk), "mimeType": "audio/pcm;rate=16000"}}}


def user_text(text: str) -> JSON:
    return {
        "clientContent": {
            "turns": [{"role": "user", "parts": [{"text": text}]}],
            "turnComplete": True,
        }
    }


def model_audio(events: list[JSON]) -> bytes:
    return b"".join(
        base64.b64decode(part["inlineData"]["data"])
        for e in of(events, "serverContent.modelTurn")
        for part in e["serverContent"]["modelTurn"]["parts"]
    )


async def test_gemini_spoken_turn_in_binary_frames() -> None:
    async with (
        RealtimeUpstream([Say(ANSWER)], transcripts=["what is my battery level"]) as upstream,
        client(upstream.gemini_url + "?key=test") as c,
    ):
        await c.send(SETUP)
        assert await c.recv() == {"setupComplete": {}}
        assert isinstance(c.frames[0], bytes)  # JSON in binary frames, as Gemini sends it
        for chunk in utterance(16000):
            await c.send(realtime_audio(chunk))
        events = await c.until("serverContent.turnComplete")

        heard = of(events, "serverContent.inputTranscription")[0]["serverContent"][
            "inputTranscription"
        ]
        assert heard == {"text": "what is my battery level"}
        assert model_audio(events) == tone(ANSWER, 24000)
        mime_types = {
            p["inlineData"]["mimeType"]
            for e in of(events, "serverContent.modelTurn")
            for p in e["serverContent"]["modelTurn"]["parts"]
        }
        assert mime_types == {"audio/pcm;rate=24000"}
        spoken = "".join(
            e["serverContent"]["outputTranscription"]["text"]
            for e in of(events, "serverContent.outputTranscription")
        )
        assert spoken == ANSWER
        assert of(events, "serverContent.generationComplete")
        usage = events[-1]["usageMetadata"]
        assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["responseTokenCount"]
        # 900 ms heard when 500 ms of silence ended the speech, 25 tokens a second
        assert {"modality": "AUDIO", "tokenCount": 22} in usage["promptTokensDetails"]
        assert usage["responseTokensDetails"] == [
            {"modality": "AUDIO", "tokenCount": len(ANSWER) * MS_PER_CHAR // 40}
        ]
        assert upstream.connections[0].path.endswith("?key=test")
        assert_healthy(upstream)


async def test_gemini_tool_call_answered_then_the_answer_in_text_frames() -> None:
    script = [Call("get_battery_level", {"device": "phone"}) + Call("get_time"), Say(ANSWER)]
    async with (
        RealtimeUpstream(script, gemini_binary_frames=False) as upstream,
        client(upstream.gemini_url) as c,
    ):
        await c.send(setup(generationConfig={"responseModalities": ["TEXT"]}))
        await c.recv()
        assert isinstance(c.frames[0], str)
        await c.send(user_text("battery?"))
        calls = (await c.until("toolCall"))[-1]["toolCall"]["functionCalls"]
        assert [(call["name"], call["args"]) for call in calls] == [
            ("get_battery_level", {"device": "phone"}),
            ("get_time", {}),
        ]
        first, second = calls
        await c.send(
            {
                "toolResponse": {
                    "functionResponses": [
                        {"id": first["id"], "name": first["name"], "response": {"level": 80}}
                    ]
                }
            }
        )
        await c.send(
            {
                "toolResponse": {
                    "functionResponses": [
                        {"id": second["id"], "name": second["name"], "response": {"time": "noon"}}
                    ]
                }
            }
        )
        events = await c.until("serverContent.turnComplete")
        assert not of(events, "toolCall")
        text = "".join(
            p["text"]
            for e in of(events, "serverContent.modelTurn")
            for p in e["serverContent"]["modelTurn"]["parts"]
        )
        assert text == ANSWER
        assert upstream.function_outputs == {
            first["id"]: [{"level": 80}],
            second["id"]: [{"time": "noon"}],
        }


async def test_gemini_barge_in_interrupts_and_cancels_outstanding_calls() -> None:
    script = [Say("A long answer that the user will interrupt."), Call("get_battery_level")]
    async with (
        RealtimeUpstream(script, transcripts=["stop", "and?"], realtime=True) as upstream,
        client(upstream.gemini_url) as c,
    ):
        await c.send(SETUP)
        await c.recv()
        await c.send(user_text("tell me"))
        await c.until("serverContent.modelTurn")
        for chunk in utterance(16000):
            await c.send(realtime_audio(chunk))
        events = await c.until("serverContent.interrupted")
        assert not of(events, "serverContent.turnComplete")
        calls = (await c.until("toolCall"))[-1]["toolCall"]["functionCalls"]  # the answer to "stop"

        for chunk in utterance(16000, speech_ms=200, silence_ms=0):
            await c.send(realtime_audio(chunk))
        cancellation = (await c.until("toolCallCancellation"))[-1]["toolCallCancellation"]
        assert cancellation == {"ids": [calls[0]["id"]]}
        await c.send(
            {
                "toolResponse": {
                    "functionResponses": [
                        {"id": calls[0]["id"], "name": "get_battery_level", "response": {}}
                    ]
                }
            }
        )
        await upstream.wait_for(lambda: upstream.outputs_after_cancel)
        assert upstream.outputs_after_cancel == {calls[0]["id"]: [{}]}
        assert_healthy(upstream)


async def test_gemini_scripted_call_cancellation() -> None:
    async with (
        RealtimeUpstream([Call("slow_lookup", call_id="c1", cancel=True)]) as upstream,
        client(upstream.gemini_url) as c,
    ):
        await c.send(SETUP)
        await c.recv()
        await c.send(user_text("look it up"))
        events = await c.until("serverContent.turnComplete")
        assert [next(iter(e)) for e in events[-4:]] == [
            "toolCall",
            "toolCallCancellation",
            "serverContent",
            "serverContent",
        ]
        assert events[-3] == {"toolCallCancellation": {"ids": ["c1"]}}
        assert upstream.cancelled_call_ids == {"c1"}
        assert_healthy(upstream)


async def test_gemini_goaway_then_close() -> None:
    async with (
        RealtimeUpstream(
            [Say("Hi.")], goaway_after_responses=1, goaway_time_left_s=0.2
        ) as upstream,
        client(upstream.gemini_url) as c,
    ):
        await c.send(SETUP)
        await c.recv()
        await c.send(user_text("hello"))
        await c.until("serverContent.turnComplete")
        assert await c.recv() == {"goAway": {"timeLeft": "0.2s"}}
        closed = await c.closed()
        assert closed.rcvd is not None
        assert closed.rcvd.code == 1000
        await upstream.wait_for(lambda: upstream.connections[0].closed)


async def test_gemini_resumption_handle_restores_the_history() -> None:
    async with RealtimeUpstream([Say("First."), Say("Second.")]) as upstream:
        async with client(upstream.gemini_url) as c:
            await c.send(setup(sessionResumption={}))
            await c.recv()
            await c.send(user_text("remember the code 1234"))
            events = await c.until("sessionResumptionUpdate")
            first_prompt = of(events, "usageMetadata")[0]["usageMetadata"]["promptTokenCount"]
            update = events[-1]["sessionResumptionUpdate"]
            assert update["resumable"] is True
        history = upstream.connections[0].history
        assert [content["role"] for content in history] == ["user", "model"]

        async with client(upstream.gemini_url) as c:
            await c.send(setup(sessionResumption={"handle": update["newHandle"]}))
            assert await c.recv() == {"setupComplete": {}}
            assert upstream.connections[1].history == history
            await c.send(user_text("what was the code?"))
            events = await c.until("sessionResumptionUpdate")
            assert model_audio(events) == tone("Second.", 24000)  # the script goes on
            assert (
                of(events, "usageMetadata")[0]["usageMetadata"]["promptTokenCount"] > first_prompt
            )
        assert upstream.connections[1].history[:2] == history

        async with client(upstream.gemini_url) as c:
            await c.send(setup(sessionResumption={"handle": "no-such-handle"}))
            closed = await c.closed()
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1008


async def test_a_replacement_connection_goes_on_with_the_next_turn() -> None:
    heard: list[int] = []

    def transcribe(pcm: bytes) -> str:
        heard.append(len(pcm))
        return "hello"

    script = [Say("One."), Say("Two.")]
    async with RealtimeUpstream(script, transcripts=transcribe, max_responses=1) as upstream:
        for expected in ("One.", "Two."):
            async with client(upstream.openai_url) as c:
                for chunk in utterance(24000):
                    await c.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})
                done = (await c.until("response.done"))[-1]["response"]
                assert done["output"][0]["content"][0]["transcript"] == expected
                assert (await c.recv())["error"]["code"] == "session_expired"
        assert heard == [900 * 48, 900 * 48]  # the committed audio: 900 ms at 24 kHz
        assert [c.responses for c in upstream.connections] == [1, 1]
        assert_healthy(upstream)


async def test_bad_paths_and_a_missing_setup_are_refused() -> None:
    async with RealtimeUpstream() as upstream:
        with pytest.raises(InvalidStatus) as refused:
            await connect(upstream.openai_url.replace("/v1/realtime", "/v1/other"))
        assert refused.value.response.status_code == 404
        async with client(upstream.gemini_url) as c:
            await c.send(user_text("hello"))
            closed = await c.closed()
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1007
        assert_healthy(upstream)


async def test_openai_scripted_call_cancellation_marks_the_call_incomplete() -> None:
    script = [Call("slow_lookup", call_id="c1", cancel=True)]
    async with RealtimeUpstream(script) as upstream, client(upstream.openai_url) as c:
        await c.send({"type": "response.create"})
        done = (await c.until("response.done"))[-1]["response"]
        assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
        assert done["output"][0]["status"] == "incomplete"
        output = {"type": "function_call_output", "call_id": "c1", "output": "late"}
        await c.send({"type": "conversation.item.create", "item": output})
        await c.until("conversation.item.done")
        assert upstream.outputs_after_cancel == {"c1": ["late"]}
        assert_healthy(upstream)


async def test_gemini_legacy_media_chunks_and_audio_stream_end() -> None:
    async with (
        RealtimeUpstream([Say("Yes.")], transcripts=["is it on"]) as upstream,
        client(upstream.gemini_url) as c,
    ):
        await c.send(
            setup(realtimeInputConfig={"automaticActivityDetection": {"silenceDurationMs": 2000}})
        )
        await c.recv()
        blob = {"data": b64(speech(300, 16000)), "mimeType": "audio/pcm;rate=16000"}
        await c.send({"realtimeInput": {"mediaChunks": [blob]}})
        await c.send({"realtimeInput": {"audioStreamEnd": True}})
        events = await c.until("serverContent.turnComplete")
        assert (
            of(events, "serverContent.inputTranscription")[0]["serverContent"][
                "inputTranscription"
            ]["text"]
            == "is it on"
        )
        assert model_audio(events) == tone("Yes.", 24000)
        assert_healthy(upstream)

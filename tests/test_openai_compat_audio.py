"""``/v1/openai/realtime`` with audio: OpenAI's SDKs hold spoken turns against a real gateway.

The official ``openai`` package's realtime client and the Agents SDK's ``RealtimeRunner``
speak to the demo agent (its scripted model) through the gateway's own voice pipeline: the
user's speech, synthesized here by piper, goes up as ``input_audio_buffer.append`` (PCM16 at
24 kHz, or G.711 at 8 kHz), and what comes back as ``response.output_audio.delta`` is
transcribed by pocketsphinx to check what it says.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from gateway.agent.file import DEMO_AGENT
from gateway.core.transcript import AssistantTurn
from gateway.voice import g711
from tests.support import Gateway, serving
from tests.voice_support import normalize, rms, say_in_real_time, spoken, transcribe

pytestmark = pytest.mark.slow

WAIT = 60.0
"""Seconds any one wait may take: the first includes the speech workers' start."""
BATTERY_TOOL = {
    "type": "function",
    "name": "get_battery_level",
    "description": "The device's battery level.",
    "parameters": {"type": "object", "properties": {}},
}


def spoken_session(fmt: str = "audio/pcm", **input_audio: Any) -> dict[str, Any]:
    """A session that speaks, in ``fmt`` both ways."""
    audio_format = {"type": fmt, "rate": 24000} if fmt == "audio/pcm" else {"type": fmt}
    return {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": audio_format,
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                **input_audio,
            },
            "output": {"format": audio_format, "voice": "alloy"},
        },
        "tools": [BATTERY_TOOL],
    }


@asynccontextmanager
async def demo_gateway(pace: float = 0.0) -> AsyncIterator[tuple[Gateway, AsyncOpenAI]]:
    """The demo agent with the offline speech engines, and an ``AsyncOpenAI`` pointed at it;
    its scripted model says a word every ``pace`` seconds."""
    async with serving(agent=str(DEMO_AGENT), scripted_pace=pace, voice_workers=1) as gateway:
        base = f"ws://127.0.0.1:{gateway.port}/v1/openai"
        yield gateway, AsyncOpenAI(api_key="sk-not-the-gateways", websocket_base_url=base)


async def append(conn: AsyncRealtimeConnection, audio: bytes, rate: int, width: int = 2) -> None:
    """Send ``audio`` in 100 ms appends, as fast as the socket takes them."""
    step = rate * width // 10
    for i in range(0, len(audio), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i : i + step]).decode())


async def until(conn: AsyncRealtimeConnection, done: Callable[[Any], bool], seen: list[Any]) -> Any:
    """Events into ``seen`` up to and including the first that ``done`` accepts."""
    async with asyncio.timeout(WAIT):
        while True:
            event = await conn.recv()
            seen.append(event)
            if done(event):
                return event


def of_type(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


def audio_of(events: list[Any]) -> bytes:
    return b"".join(
        base64.b64decode(e.delta) for e in of_type(events, "response.output_audio.delta")
    )


class Microphone:
    """Sends audio as ``input_audio_buffer.append`` (for ``say_in_real_time``)."""

    def __init__(self, conn: AsyncRealtimeConnection) -> None:
        self._conn = conn

    async def send_audio(self, pcm: bytes) -> None:
        await self._conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())


def is_done(event: Any) -> bool:
    return bool(event.type == "response.done")


async def test_a_spoken_battery_question_gets_the_call_and_a_spoken_answer(tts, stt):
    async with demo_gateway() as (_, client), client.realtime.connect(model="gpt-realtime") as conn:
        created = await conn.recv()
        assert created.session.output_modalities == ["text"]
        await conn.session.update(session=spoken_session())  # type: ignore[arg-type]
        seen: list[Any] = []
        updated = await until(conn, lambda e: e.type == "session.updated", seen)
        assert updated.session.output_modalities == ["audio"]
        assert updated.session.audio.input.format.type == "audio/pcm"
        assert updated.session.audio.output.voice == "joe"  # no "alloy" here: its own
        await append(conn, spoken(tts, "what's my battery level?", 24000), 24000)
        first = await until(conn, is_done, seen)
        (call,) = first.response.output
        assert (call.type, call.name) == ("function_call", "get_battery_level")
        await conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"level": 0.82, "charging": false}',
            }  # type: ignore[arg-type]
        )
        await conn.response.create()
        answer: list[Any] = []
        second = await until(conn, is_done, answer)

    kinds = [e.type for e in seen]
    for before, after in [
        ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"),
        ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed"),
        ("input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed"),
        ("conversation.item.input_audio_transcription.completed", "response.created"),
    ]:
        assert kinds.index(before) < kinds.index(after), (before, after)
    started = of_type(seen, "input_audio_buffer.speech_started")[0]
    assert (
        200
        <= started.audio_start_ms
        < of_type(seen, "input_audio_buffer.speech_stopped")[0].audio_end_ms
    )
    (heard,) = of_type(seen, "conversation.item.input_audio_transcription.completed")
    assert "battery" in heard.transcript
    assert (
        heard.item_id == started.item_id == of_type(seen, "input_audio_buffer.committed")[0].item_id
    )
    assert first.response.status == "completed"

    # The answer: its transcript, then its audio, and the item closes once the audio is out.
    kinds = [e.type for e in answer]
    assert second.response.status == "completed"
    assert second.response.output_modalities == ["audio"]
    transcript = of_type(answer, "response.output_audio_transcript.done")[0].transcript
    assert transcript == "Your battery is at 82%."
    deltas = "".join(e.delta for e in of_type(answer, "response.output_audio_transcript.delta"))
    assert deltas == transcript
    last_audio = max(i for i, kind in enumerate(kinds) if kind == "response.output_audio.delta")
    assert (
        last_audio
        < kinds.index("response.output_audio.done")
        < kinds.index("response.output_item.done")
    )
    (item,) = second.response.output
    assert (item.status, item.content[0].type, item.content[0].transcript) == (
        "completed",
        "output_audio",
        transcript,
    )
    pcm = audio_of(answer)
    assert rms(pcm) > 300
    alone = b"".join(tts.synthesize(transcript, 24000))
    assert abs(len(pcm) - len(alone)) <= 0.25 * len(alone)
    said = transcribe(stt, pcm, 24000)
    assert "battery" in said or "eighty" in said, said


async def test_g711_mu_law_in_and_out_at_8_khz(tts, stt):
    async with demo_gateway() as (_, client), client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await conn.session.update(session=spoken_session("audio/pcmu"))  # type: ignore[arg-type]
        seen: list[Any] = []
        updated = await until(conn, lambda e: e.type == "session.updated", seen)
        assert updated.session.audio.output.format.type == "audio/pcmu"
        question = g711.encode("pcmu", spoken(tts, "hello", 8000))
        await append(conn, question, 8000, width=1)
        await until(conn, is_done, seen)

    (heard,) = of_type(seen, "conversation.item.input_audio_transcription.completed")
    assert "hello" in heard.transcript
    transcript = of_type(seen, "response.output_audio_transcript.done")[0].transcript
    assert transcript.startswith("Hello! I can open your settings")
    codes = audio_of(seen)  # one byte a sample at 8 kHz
    alone = b"".join(tts.synthesize(transcript, 8000))
    assert abs(len(codes) * 2 - len(alone)) <= 0.25 * len(alone)
    said = transcribe(stt, g711.decode("pcmu", codes), 8000)
    # Narrowband audio is hard on pocketsphinx: the content words, not every word.
    words = {"open", "settings", "check", "battery", "find", "store", "order", "would", "like"}
    assert len(words & set(normalize(said))) >= 4, said


async def test_speaking_over_the_answer_cancels_it_and_truncate_cuts_the_history(tts):
    # A word every 0.3 s: the greeting is still being generated when the user speaks.
    async with (
        demo_gateway(pace=0.3) as (gateway, client),
        client.realtime.connect(model="gpt-realtime") as conn,
    ):
        await conn.recv()
        session = spoken_session()
        session["audio"]["input"]["turn_detection"]["silence_duration_ms"] = 300
        await conn.session.update(session=session)  # type: ignore[arg-type]
        seen: list[Any] = []
        await until(conn, lambda e: e.type == "session.updated", seen)
        await append(conn, spoken(tts, "hello, can you help me?", 24000), 24000)
        # The long greeting (or the list of what it can do) starts playing...
        first = await until(conn, lambda e: e.type == "response.output_audio.delta", seen)
        playing_since = time.perf_counter()
        # ... and the user speaks over it, at a microphone's pace.
        speaking = asyncio.create_task(
            say_in_real_time(Microphone(conn), spoken(tts, "thank you", 24000), 24000)
        )
        await until(conn, lambda e: e.type == "input_audio_buffer.speech_started", seen)
        # The device stops playing, and says how much it played, at once (as OpenAI's do).
        played_ms = int((time.perf_counter() - playing_since) * 1000)
        await conn.conversation.item.truncate(
            item_id=first.item_id, content_index=0, audio_end_ms=played_ms
        )
        truncated = await until(conn, lambda e: e.type == "conversation.item.truncated", seen)
        cancelled = next(
            (e for e in seen if is_done(e) and e.response.status == "cancelled"), None
        ) or await until(conn, lambda e: is_done(e) and e.response.status == "cancelled", seen)
        await speaking
        await until(conn, lambda e: is_done(e) and e.response.status == "completed", seen)

    kinds = [e.type for e in seen]
    assert kinds.index(
        "input_audio_buffer.speech_started", kinds.index("response.output_audio.delta")
    ) < kinds.index("response.done")
    assert cancelled.response.status_details.reason == "turn_detected"
    (item,) = cancelled.response.output
    assert item.status == "incomplete"
    assert (truncated.item_id, truncated.audio_end_ms) == (first.item_id, played_ms)
    # The model's next request holds what had played of the answer, not all of it.
    heard = [i.text for i in gateway.model.requests[-1].items if isinstance(i, AssistantTurn)][-1]
    said = of_type(seen, "response.output_audio_transcript.done")[0].transcript
    assert heard
    assert said.startswith(heard)
    assert len(heard) < len(said) // 2


async def test_manual_turns_commit_by_hand_and_response_create_gets_the_answer(tts):
    async with demo_gateway() as (_, client), client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await conn.session.update(session=spoken_session(turn_detection=None))  # type: ignore[arg-type]
        seen: list[Any] = []
        updated = await until(conn, lambda e: e.type == "session.updated", seen)
        assert updated.session.audio.input.turn_detection is None
        await append(conn, spoken(tts, "hello", 24000), 24000)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        done = await until(conn, is_done, seen)
        await conn.input_audio_buffer.append(audio=base64.b64encode(b"\0\0" * 2400).decode())
        await conn.input_audio_buffer.clear(event_id="clear-1")
        await until(conn, lambda e: e.type == "input_audio_buffer.cleared", seen)

    kinds = [e.type for e in seen]
    assert "input_audio_buffer.speech_started" not in kinds  # no turn detection: no VAD events
    assert "error" not in kinds
    assert kinds.count("response.created") == 1
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    assert done.response.status == "completed"
    assert audio_of(seen)


async def test_bad_audio_gets_errors_and_the_session_goes_on(tts):
    async with demo_gateway() as (_, client), client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await conn.input_audio_buffer.append(audio="AAAA", event_id="off-1")  # audio is off
        off = await conn.recv()
        await conn.session.update(session=spoken_session())  # type: ignore[arg-type]
        seen: list[Any] = []
        await until(conn, lambda e: e.type == "session.updated", seen)
        await conn.input_audio_buffer.append(audio="not base64!", event_id="b64-1")
        not_b64 = await conn.recv()
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(b"\0\0\0").decode(), event_id="odd-1"
        )
        odd = await conn.recv()
        bad_format = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/opus"}}}}
        await conn.session.update(session=bad_format, event_id="fmt-1")  # type: ignore[arg-type]
        fmt = await conn.recv()
        await conn.send({"type": "output_audio_buffer.clear", "event_id": "webrtc-1"})  # type: ignore[arg-type]
        webrtc = await conn.recv()
        await append(conn, spoken(tts, "hello", 24000), 24000)
        done = await until(conn, is_done, seen)

    assert (off.error.event_id, off.error.code) == ("off-1", "invalid_audio")
    assert "output_modalities" in off.error.message
    assert (not_b64.error.event_id, not_b64.error.code) == ("b64-1", "invalid_audio")
    assert (odd.error.event_id, odd.error.code) == ("odd-1", "invalid_audio")
    assert (fmt.error.event_id, fmt.error.code) == ("fmt-1", "invalid_message")
    assert (webrtc.error.event_id, webrtc.error.code) == ("webrtc-1", "unsupported")
    assert done.response.status == "completed"
    assert audio_of(seen)


async def test_the_agents_sdk_holds_a_spoken_turn_with_its_function_tool(tts, stt):
    """``RealtimeRunner`` with its own defaults (audio out, semantic VAD, voice ``ash``,
    PCM16): the spoken question runs the agent's tool once, and the answer is heard."""
    import agents
    from agents.realtime import RealtimeAgent, RealtimeRunner

    ran: list[str] = []

    @agents.function_tool
    def get_battery_level() -> str:
        """The device's battery level."""
        ran.append("get_battery_level")
        return json.dumps({"level": 0.64, "charging": False})

    async with demo_gateway() as (gateway, _):
        agent = RealtimeAgent(name="phone", instructions="Be brief.", tools=[get_battery_level])
        url = f"ws://127.0.0.1:{gateway.port}/v1/openai/realtime?model=gpt-realtime"
        session = await RealtimeRunner(agent).run(model_config={"url": url, "api_key": "sk-x"})
        audio: list[bytes] = []
        transcripts: list[str] = []
        errors: list[Any] = []
        async with session:
            await session.send_audio(spoken(tts, "what's my battery level?", 24000))
            async with asyncio.timeout(WAIT):
                async for event in session:
                    if event.type == "error":
                        errors.append(event)
                    elif event.type == "audio":
                        audio.append(event.audio.data)
                    elif event.type == "raw_model_event" and event.data.type == "raw_server_event":
                        raw = event.data.data
                        if raw["type"] == "response.output_audio_transcript.done":
                            transcripts.append(raw["transcript"])
                        if raw["type"] == "response.done" and transcripts:
                            break

    assert ran == ["get_battery_level"]
    assert transcripts == ["Your battery is at 64%."]
    assert not errors
    pcm = b"".join(audio)
    said = transcribe(stt, pcm, 24000)
    assert "battery" in said or "sixty" in said, said

"""Speech-to-speech providers: a gateway whose agent's model is an upstream realtime model.

The upstream here is the scripted one (``tests/realtime_upstream``), which speaks OpenAI
Realtime and Gemini Live, hears by energy and says tones; the client is the gateway's own
Python SDK over v1 with audio on. What is checked: the model's calls come back to the gateway
(a client function goes to the app, an async server tool answers upstream at once with its
pending placeholder and later as context), each answered upstream exactly once; its audio is
relayed to the client as the answer's frames; a barge-in cancels and truncates upstream.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from client_sdk import connect
from client_sdk.client import Conversation
from gateway.agent.file import DEMO_AGENT
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import (
    AudioDone,
    AudioFlush,
    Error,
    InputSpeechStarted,
    InputTranscript,
    Outbound,
    ResponseCreated,
    ResponseDone,
    TextDone,
    ToolCalls,
)
from tests.data.tools import gate, reset_gates
from tests.realtime_upstream import Call, RealtimeUpstream, Say, tone
from tests.support import Gateway, serving
from tests.test_aimock import CLI
from tests.test_aimock import aimock as run_aimock
from tests.voice_support import spoken, transcribe

AGENT = Path(__file__).parent / "data" / "realtime_agent.toml"
REALTIME_FIXTURES = Path(__file__).parent / "data" / "aimock" / "realtime.json"
WAIT = 20.0
SPEECH = tone("what is my battery level", 16000)
"""What the user says, as the scripted upstream hears it: loud enough for its energy VAD."""
SILENCE = b"\0\0" * 16000


@asynccontextmanager
async def realtime_gateway(
    upstream: RealtimeUpstream, provider: str = "openai-realtime", **overrides: Any
) -> AsyncIterator[Gateway]:
    """The test agent on ``upstream``, as OpenAI Realtime or Gemini Live."""
    text = AGENT.read_text()
    if provider == "gemini-live":
        text = text.replace('"openai-realtime"', '"gemini-live"').replace("gpt-realtime", "live")
    with tempfile.TemporaryDirectory() as folder:
        agent = Path(folder) / "agent.toml"
        agent.write_text(
            text.replace(
                "connect_timeout = 5",
                "connect_timeout = 5\n"
                + "\n".join(f"{key} = {value}" for key, value in overrides.items()),
            )
        )
        base = (
            upstream.gemini_url
            if provider == "gemini-live"
            else upstream.openai_url.removesuffix("/realtime")
        )
        async with serving(agent=str(agent), base_url=base) as gateway:
            yield gateway


async def until(
    events: AsyncIterator[Outbound], kind: type, seen: list[Outbound], wait: float = WAIT
) -> Any:
    async with asyncio.timeout(wait):
        async for event in events:
            seen.append(event)
            if isinstance(event, kind):
                return event
    raise AssertionError(f"no {kind.__name__}")


def answer_battery(conv: Conversation) -> list[str]:
    """Answer ``get_battery_level`` as a phone would; the calls it answered."""
    ran: list[str] = []

    @conv.client_function("get_battery_level")
    async def battery() -> dict[str, Any]:
        ran.append("get_battery_level")
        return {"level": 0.82, "charging": False}

    return ran


async def say(conv: Conversation, pcm: bytes) -> None:
    for i in range(0, len(pcm), 640):  # 20 ms frames at 16 kHz
        await conv.send_audio(pcm[i : i + 640])


async def collect(
    audio: AsyncIterator[AnswerAudio],
    into: list[AnswerAudio],
    enough: tuple[int, asyncio.Event] | None = None,
) -> None:
    """Frames into ``into``; with ``enough``, set its event once that many bytes came."""
    size = 0
    async for frame in audio:
        into.append(frame)
        size += len(frame.pcm)
        if enough is not None and size >= enough[0]:
            enough[1].set()


@pytest.mark.parametrize("provider", ["openai-realtime", "gemini-live"])
async def test_a_spoken_question_calls_the_apps_function_and_the_answer_is_relayed(provider):
    reset_gates()
    script = [Call("get_battery_level", {}), Say("Your battery is at 82 percent.")]
    async with (
        RealtimeUpstream(script, transcripts=["what is my battery level"]) as upstream,
        realtime_gateway(upstream, provider) as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):
        ran = answer_battery(conv)

        created = await conv.start()
        assert created.voices[0] == ("alloy" if provider == "openai-realtime" else "Puck")
        events, frames = conv.events(), list[AnswerAudio]()
        reading = asyncio.create_task(collect(conv.audio(), frames))
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        done = await until(events, AudioDone, seen)
        reading.cancel()
        await upstream.wait_for(lambda: len(upstream.function_outputs) == 1)

    assert upstream.failures == []
    kinds = [type(e) for e in seen]
    assert kinds.index(InputTranscript) < kinds.index(ToolCalls)
    if provider == "openai-realtime":  # Gemini says nothing of the user's speech but words
        assert kinds.index(InputSpeechStarted) < kinds.index(InputTranscript)
    else:  # and answers speech by itself: the gateway asked for no response
        assert not upstream.connections[0].received_of("clientContent")
    final = next(e for e in seen if isinstance(e, InputTranscript))
    assert final.text == "what is my battery level"
    assert ran == ["get_battery_level"]
    (outputs,) = upstream.function_outputs.values()
    assert len(outputs) == 1  # answered upstream exactly once
    text = next(e for e in seen if isinstance(e, TextDone)).text
    assert text == "Your battery is at 82 percent."
    response_done = next(e for e in seen if isinstance(e, ResponseDone))
    assert response_done.status == "completed"
    usage = response_done.usage
    assert usage is not None
    # The upstream's audio tokens, apart and in the totals (the scripted one counts them).
    assert 0 < usage.output_audio_tokens <= usage.output_tokens
    assert 0 < usage.input_audio_tokens <= usage.input_tokens
    pcm = b"".join(f.pcm for f in frames if f.response_id == done.response_id)
    assert pcm == tone(text, 24000)  # relayed as the model said it
    assert done.audio_ms == len(pcm) * 1000 // 48000


@pytest.mark.parametrize("provider", ["openai-realtime", "gemini-live"])
async def test_an_async_lookup_answers_pending_upstream_and_its_result_is_spoken_later(provider):
    reset_gates()
    script = [
        Call("lookup_order", {"order_id": "42"}),
        Say("I'm looking that up."),
        Say("Order 42 has shipped."),
    ]
    async with (
        RealtimeUpstream(script, transcripts=["where is my order 42"]) as upstream,
        realtime_gateway(upstream, provider) as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):
        await conv.start()
        events = conv.events()
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        first = await until(events, AudioDone, seen)
        # The lookup ends while the user is idle: its result reaches the model as context,
        # and the model's update is spoken.
        gate("order:42").set()
        second = await until(events, AudioDone, seen)

    assert upstream.failures == []
    (outputs,) = upstream.function_outputs.values()
    assert [json_of(o) for o in outputs] == [{"status": "pending"}]  # once, at once
    texts = [e.text for e in seen if isinstance(e, TextDone)]
    assert texts == ["I'm looking that up.", "Order 42 has shipped."]
    note_text = context_sent(upstream, provider)
    assert note_text.startswith("<context>")
    assert "shipped" in note_text
    assert first.response_id != second.response_id
    dones = [e for e in seen if isinstance(e, ResponseDone)]
    assert [d.status for d in dones] == ["completed", "completed"]


@pytest.mark.parametrize("provider", ["openai-realtime", "gemini-live"])
async def test_speaking_over_the_answer_cancels_and_truncates_it_upstream(provider):
    reset_gates()
    long = "This answer goes on and on, long enough to be spoken over by the user."
    script = [Say(long), Say("Yes?")]
    async with (
        RealtimeUpstream(script, transcripts=["hello", "wait"], realtime=True) as upstream,
        realtime_gateway(upstream, provider) as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):
        await conv.start()
        events, frames, second_out = conv.events(), list[AnswerAudio](), asyncio.Event()
        reading = asyncio.create_task(collect(conv.audio(), frames, (48000, second_out)))
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        async with asyncio.timeout(WAIT):  # a second of the answer has come
            await second_out.wait()
        await say(conv, SPEECH + SILENCE)
        flushed = await until(events, AudioFlush, seen)
        cancelled = await until(events, ResponseDone, seen)
        if provider == "openai-realtime":  # Gemini cuts its answer itself: nothing to send
            await upstream.wait_for(lambda: upstream.truncations)
        reading.cancel()

    assert upstream.failures == []
    answer = next(e for e in seen if isinstance(e, ResponseCreated))
    assert flushed.response_id == answer.response_id
    assert (cancelled.response_id, cancelled.status) == (answer.response_id, "cancelled")
    if provider == "openai-realtime":  # stopped and cut upstream to what played
        (truncation,) = upstream.truncations
        full_ms = len(tone(long, 24000)) * 1000 // 48000
        assert 0 < truncation["audio_end_ms"] < full_ms
        assert [e for e in upstream.connections[0].received if e["type"] == "response.cancel"]
    else:  # Gemini stopped its answer itself
        assert any(
            e.get("serverContent", {}).get("interrupted") for e in upstream.connections[0].sent
        )


async def test_an_upstream_session_that_ends_is_replaced_with_the_conversation_carried_over():
    reset_gates()
    script = [Call("get_battery_level", {}), Say("At 82 percent."), Say("You are welcome.")]
    async with (
        RealtimeUpstream(
            script, transcripts=["what is my battery level", "thanks"], max_responses=2
        ) as upstream,
        realtime_gateway(upstream) as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):

        @conv.client_function("get_battery_level")
        async def battery() -> dict[str, Any]:
            return {"level": 0.82}

        await conv.start()
        events = conv.events()
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        await until(events, AudioDone, seen)
        # The upstream ends its session after two responses (as OpenAI does at 60 minutes).
        await upstream.wait_for(lambda: upstream.connections[0].closed)
        await say(conv, SPEECH + SILENCE)
        await until(events, AudioDone, seen)

    assert upstream.failures == []
    assert len(upstream.connections) == 2
    texts = [e.text for e in seen if isinstance(e, TextDone)]
    assert texts == ["At 82 percent.", "You are welcome."]
    assert not [e for e in seen if isinstance(e, Error)]  # the client never noticed
    first, second = (
        [e["item"] for e in c.received if e["type"] == "conversation.item.create"]
        for c in upstream.connections
    )
    # Answered once, on the first session; the second has it in the history it was given.
    assert [i["type"] for i in first] == ["function_call_output"]
    assert [i["type"] for i in second][:4] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def context_sent(upstream: RealtimeUpstream, provider: str) -> str:
    """The one context note the gateway gave the upstream model."""
    if provider == "openai-realtime":
        (note,) = [
            e["item"]
            for e in upstream.received("conversation.item.create")
            if e["item"]["type"] == "message"
        ]
        return str(note["content"][0]["text"])
    (content,) = upstream.received("clientContent")
    return str(content["clientContent"]["turns"][0]["parts"][0]["text"])


def json_of(output: Any) -> Any:
    return json.loads(output) if isinstance(output, str) else output


@pytest.mark.slow
async def test_through_a_second_gateways_realtime_endpoint_a_spoken_question_is_answered_aloud(
    tts, stt
):
    """The upstream is a real audio-capable realtime server: another gateway's OpenAI-
    compatible endpoint with its offline speech engines and the demo agent's model."""
    reset_gates()
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as upstream,
        serving(agent=str(AGENT), base_url=f"ws://127.0.0.1:{upstream.port}/v1/openai") as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):
        ran = answer_battery(conv)

        await conv.start()
        events, frames = conv.events(), list[AnswerAudio]()
        reading = asyncio.create_task(collect(conv.audio(), frames))
        await say(conv, spoken(tts, "what's my battery level?"))
        seen: list[Outbound] = []
        done = await until(events, AudioDone, seen, wait=90.0)
        reading.cancel()

    final = next(e for e in seen if isinstance(e, InputTranscript))
    assert "battery" in final.text
    assert ran == ["get_battery_level"]
    text = next(e for e in seen if isinstance(e, TextDone)).text
    assert text == "Your battery is at 82%."
    pcm = b"".join(f.pcm for f in frames if f.response_id == done.response_id)
    assert done.audio_ms == len(pcm) * 1000 // 48000 > 1000
    heard = transcribe(stt, pcm, 24000)
    assert "battery" in heard or "eighty" in heard, heard


@pytest.mark.parametrize("provider", ["openai-realtime", "gemini-live"])
async def test_before_the_upstreams_cap_a_new_session_takes_over_with_an_open_call(provider):
    """The session is replaced while a client function's call is open: its output goes to
    the new session, once, under the call id the new session was given with the history
    (Gemini, which pairs a call with its response, gets it as context)."""
    reset_gates()
    script = [Call("get_battery_level", {}), Say("At 82 percent."), Say("Bye now.")]
    release = asyncio.Event()
    async with (
        RealtimeUpstream(script, transcripts=["what is my battery level", "bye"]) as upstream,
        realtime_gateway(upstream, provider, max_session_s=0.3) as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):

        @conv.client_function("get_battery_level")
        async def battery() -> dict[str, Any]:
            await release.wait()  # the app takes its time: the upstream session is replaced
            return {"level": 0.82}

        await conv.start()
        events = conv.events()
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        await until(events, ToolCalls, seen)
        await upstream.wait_for(lambda: len(upstream.connections) >= 2)
        release.set()
        await until(events, AudioDone, seen)
        await say(conv, SPEECH + SILENCE)
        await until(events, AudioDone, seen)

    assert upstream.failures == []
    assert not [e for e in seen if isinstance(e, Error)]
    assert [e.text for e in seen if isinstance(e, TextDone)] == ["At 82 percent.", "Bye now."]
    call_id = next(e for e in seen if isinstance(e, ToolCalls)).calls[0].call_id
    if provider == "gemini-live":
        notes = [
            (n, part["text"])
            for n, c in enumerate(upstream.connections)
            for e in c.received_of("clientContent")
            for turn in e["clientContent"].get("turns", [])
            for part in turn["parts"]
            if "get_battery_level" in part.get("text", "") and "completed" in part["text"]
        ]
        assert notes[0][0] >= 1  # after the first session was replaced
        assert not [c for c in upstream.connections if c.received_of("toolResponse")]
        return
    outputs = [
        (n, e["item"]["call_id"])
        for n, c in enumerate(upstream.connections)
        for e in c.received
        if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"
    ]
    # Sent once, to the session that took over (later ones have it in their history).
    assert outputs[0] == (1, call_id)
    assert all(n > 1 for n, _ in outputs[1:])
    seeded = [
        e["item"]
        for e in upstream.connections[1].received
        if e["type"] == "conversation.item.create"
    ]
    assert {"type": "function_call", "call_id": call_id}.items() <= seeded[1].items()
    assert upstream.connections[0].closed


async def test_gemini_go_away_moves_the_conversation_to_a_resumed_session():
    reset_gates()
    script = [Say("Hello there."), Say("Still here.")]
    async with (
        RealtimeUpstream(
            script,
            transcripts=["hello", "are you there"],
            goaway_after_responses=1,
            goaway_time_left_s=5.0,
        ) as upstream,
        realtime_gateway(upstream, "gemini-live") as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):
        await conv.start()
        events = conv.events()
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        await until(events, AudioDone, seen)
        await upstream.wait_for(lambda: len(upstream.connections) == 2)
        await say(conv, SPEECH + SILENCE)
        await until(events, AudioDone, seen)

    assert upstream.failures == []
    assert not [e for e in seen if isinstance(e, Error)]
    assert [e.text for e in seen if isinstance(e, TextDone)] == ["Hello there.", "Still here."]
    (setup,) = upstream.connections[1].received_of("setup")
    assert setup["setup"]["sessionResumption"]["handle"] in upstream.gemini_handles
    assert not upstream.connections[1].received_of("clientContent")  # resumed, not seeded


@pytest.mark.skipif(
    not os.environ.get("CI") and (not CLI.exists() or shutil.which("node") is None),
    reason="aimock is not installed (make test installs it with npm into .aimock/)",
)
@pytest.mark.parametrize("provider", ["openai-realtime", "gemini-live"])
async def test_against_aimock_a_typed_question_calls_the_apps_function_then_answers(provider):
    """aimock's realtime endpoints (text and function calls, no audio) as the upstream: a
    typed message reaches the model, its call the app, the app's output the model once."""
    async with run_aimock(fixtures=REALTIME_FIXTURES) as url:
        base = url.replace("http://", "ws://")
        if provider == "openai-realtime":
            base += "/v1"
        else:
            base += "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
        text = AGENT.read_text()
        if provider == "gemini-live":
            text = text.replace('"openai-realtime"', '"gemini-live"')
        with tempfile.TemporaryDirectory() as folder:
            agent = Path(folder) / "agent.toml"
            agent.write_text(text)
            async with (
                serving(agent=str(agent), base_url=base) as gateway,
                connect(gateway.url) as conv,
            ):
                ran = answer_battery(conv)
                await conv.start()
                events = conv.events()
                await conv.post("what is my battery level")
                seen: list[Outbound] = []
                done = await until(events, ResponseDone, seen)

    assert ran == ["get_battery_level"]
    assert done.status == "completed"
    texts = [e.text for e in seen if isinstance(e, TextDone)]
    assert texts[-1] == "Your battery is at 80 percent."


async def test_an_openai_sdk_client_of_the_gateway_hears_the_speech_to_speech_model():
    """The app speaks OpenAI Realtime to the gateway, the gateway to the upstream model."""
    reset_gates()
    script = [Say("Hello from upstream.")]
    async with (
        RealtimeUpstream(script, transcripts=["hello"]) as upstream,
        realtime_gateway(upstream) as gateway,
    ):
        client = AsyncOpenAI(
            api_key="sk-x", websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1/openai"
        )
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.recv()
            audio = {
                "input": {"format": {"type": "audio/pcm", "rate": 24000}},
                "output": {"voice": "alloy"},
            }
            await conn.session.update(
                session={"type": "realtime", "output_modalities": ["audio"], "audio": audio}
            )  # type: ignore[typeddict-item]
            events: list[Any] = []
            async with asyncio.timeout(WAIT):
                while (event := await conn.recv()).type != "session.updated":
                    events.append(event)
                speech = tone("hello", 24000) + b"\0\0" * 24000
                for i in range(0, len(speech), 4800):
                    await conn.input_audio_buffer.append(
                        audio=base64.b64encode(speech[i : i + 4800]).decode()
                    )
                while (event := await conn.recv()).type != "response.done":
                    events.append(event)

    assert upstream.failures == []
    assert event.response.status == "completed"
    pcm = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert pcm == tone("Hello from upstream.", 24000)
    (transcript,) = [
        e.transcript for e in events if e.type == "response.output_audio_transcript.done"
    ]
    assert transcript == "Hello from upstream."
    kinds = [e.type for e in events]
    assert max(i for i, k in enumerate(kinds) if k == "response.output_audio.delta") < kinds.index(
        "response.output_audio.done"
    )


async def test_an_upstream_that_cannot_be_reached_is_an_error_once_and_the_session_lives():
    """Nothing listens where the model should be: the client's audio gets one error (not one
    a frame), a typed message's response fails, and the session goes on."""
    async with (
        serving(agent=str(AGENT), base_url="ws://127.0.0.1:9/v1") as gateway,
        connect(gateway.url, audio={"input_rate": 16000, "output_rate": 24000}) as conv,
    ):
        await conv.start()
        events = conv.events()
        await say(conv, SPEECH)
        seen: list[Outbound] = []
        error = await until(events, Error, seen)
        await conv.post("hello?")
        done = await until(events, ResponseDone, seen)

    assert (error.code, error.retryable) == ("speech_failed", True)
    assert "could not be opened" in error.message
    assert [e.code for e in seen if isinstance(e, Error)].count("speech_failed") == 1
    assert done.status == "failed"

"""The Gemini Live adapter (gateway/providers/realtime/gemini.py) against the scripted upstream
(tests/realtime_upstream/), and against aimock's Gemini Live endpoint for text and a tool call."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from gateway.core.transcript import (
    AssistantTurn,
    ContextNote,
    RequestedCall,
    ToolOutcome,
    UserTurn,
    completion_note,
)
from gateway.errors import ProviderError
from gateway.providers.realtime.gemini import GeminiLiveUpstream, _seconds
from gateway.providers.realtime.upstream import (
    AudioDelta,
    CallRequested,
    CallsCancelled,
    Closed,
    GoingAway,
    Resumable,
    SpeechStarted,
    TextDelta,
    TurnDone,
    TurnStarted,
    UpstreamEvent,
    UpstreamSetup,
    UserTranscript,
)
from tests.realtime_upstream import FALLBACK, MS_PER_CHAR, Call, RealtimeUpstream, Say, tone
from tests.test_aimock import CLI
from tests.test_aimock import aimock as run_aimock
from tests.test_realtime_upstream import assert_healthy, speech, utterance

ANSWER = "It is at 80 percent."
TOOLS = (
    {
        "name": "get_battery_level",
        "description": "The device's battery level",
        "parameters": {"type": "object", "properties": {"device": {"type": "string"}}},
    },
)
SETUP = UpstreamSetup(instructions="Be brief.", tools=TOOLS, voice="Puck", silence_ms=500)


class Events:
    """The adapter's events, read with a bound on every wait."""

    def __init__(self, upstream: GeminiLiveUpstream) -> None:
        self._events = upstream.events()

    async def until(self, kind: type[UpstreamEvent], within: float = 5.0) -> list[UpstreamEvent]:
        """Every event up to and including the first of ``kind``."""
        seen: list[UpstreamEvent] = []
        async with asyncio.timeout(within):
            while not seen or not isinstance(seen[-1], kind):
                seen.append(await anext(self._events))
        return seen

    async def rest(self, within: float = 5.0) -> list[UpstreamEvent]:
        """Every event until the iterator ends."""
        async with asyncio.timeout(within):
            return [event async for event in self._events]


@asynccontextmanager
async def gemini(
    url: str, setup: UpstreamSetup = SETUP, *, model: str = "gemini-live-test"
) -> AsyncIterator[tuple[GeminiLiveUpstream, Events]]:
    adapter = GeminiLiveUpstream(url=url, model=model, api_key="secret-key")
    await adapter.open(setup)
    try:
        yield adapter, Events(adapter)
    finally:
        await adapter.aclose()


def kinds(events: list[UpstreamEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def audio(events: list[UpstreamEvent]) -> bytes:
    return b"".join(e.pcm for e in events if isinstance(e, AudioDelta))


def text(events: list[UpstreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def without_deltas(events: list[UpstreamEvent]) -> list[str]:
    return [k for k in kinds(events) if k not in ("AudioDelta", "TextDelta")]


def steps(events: list[UpstreamEvent]) -> list[str]:
    """A turn's steps: no deltas, no resumption handle (the upstream sends the previous
    turn's when that turn's task gets to it, maybe after the next turn began)."""
    return [k for k in without_deltas(events) if k != "Resumable"]


# --- The scripted upstream ------------------------------------------------------------------


async def test_a_spoken_turn_is_heard_transcribed_and_answered_in_audio() -> None:
    async with (
        RealtimeUpstream([Say(ANSWER)], transcripts=["what is my battery level"]) as upstream,
        gemini(upstream.gemini_url) as (adapter, events),
    ):
        assert (adapter.input_rate, adapter.output_rate) == (16000, 24000)
        for chunk in utterance(16000):
            await adapter.send_audio(chunk)
        turn = await events.until(TurnDone)

        assert without_deltas(turn) == ["UserTranscript", "TurnStarted", "TurnDone"]
        assert turn[0] == UserTranscript("what is my battery level")
        assert audio(turn) == tone(ANSWER, 24000)
        assert text(turn) == ANSWER
        done = turn[-1]
        assert isinstance(done, TurnDone)
        assert (done.status, done.error) == ("completed", None)
        assert done.usage is not None
        assert done.usage.output_audio_tokens == len(ANSWER) * MS_PER_CHAR // 40
        assert done.usage.input_audio_tokens == 22  # 900 ms heard at 25 tokens a second
        assert done.usage.input_text_tokens > 0
        assert isinstance((await events.until(Resumable))[-1], Resumable)

        connection = upstream.connections[0]
        assert connection.path.endswith("?key=secret-key")
        assert connection.received[0] == {
            "setup": {
                "model": "models/gemini-live-test",
                "generationConfig": {
                    "responseModalities": ["AUDIO"],
                    "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Puck"}}},
                },
                "systemInstruction": {"parts": [{"text": "Be brief."}]},
                "tools": [{"functionDeclarations": list(TOOLS)}],
                "inputAudioTranscription": {},
                "outputAudioTranscription": {},
                "realtimeInputConfig": {"automaticActivityDetection": {"silenceDurationMs": 500}},
                "sessionResumption": {},
            }
        }
        sent = connection.received_of("realtimeInput")
        assert len(sent) == 10
        assert sent[0]["realtimeInput"]["audio"]["mimeType"] == "audio/pcm;rate=16000"
        assert_healthy(upstream)


async def test_a_function_call_is_answered_once_and_gemini_goes_on_by_itself() -> None:
    script = [
        Call("get_battery_level", {"device": "phone"}, call_id="call_1")
        + Call("get_time", call_id="call_2"),
        Say(ANSWER),
    ]
    async with RealtimeUpstream(script) as upstream, gemini(upstream.gemini_url) as (g, events):
        await g.send_user_text("what is my battery level")
        await g.respond()
        turn = await events.until(TurnDone)
        assert turn == [
            TurnStarted(),
            CallRequested("call_1", "get_battery_level", {"device": "phone"}),
            CallRequested("call_2", "get_time", {}),
            TurnDone("completed"),
        ]

        await g.send_tool_output("call_1", "get_battery_level", {"level": 80})
        await g.send_tool_output("call_2", "get_time", "noon")
        await g.respond()  # nothing buffered after outputs: Gemini goes on by itself
        answer = await events.until(TurnDone)
        assert without_deltas(answer) == ["TurnStarted", "TurnDone"]
        assert (text(answer), audio(answer)) == (ANSWER, tone(ANSWER, 24000))

        assert upstream.function_outputs == {
            "call_1": [{"level": 80}],
            "call_2": [{"output": "noon"}],
        }
        assert len(upstream.received("clientContent")) == 1
        assert upstream.received("toolResponse")[0] == {
            "toolResponse": {
                "functionResponses": [
                    {"id": "call_1", "name": "get_battery_level", "response": {"level": 80}}
                ]
            }
        }
        assert_healthy(upstream)


async def test_a_cancelled_call_is_reported_and_its_output_never_sent() -> None:
    script = [Call("slow_lookup", call_id="c1", cancel=True), Say("Done.")]
    async with RealtimeUpstream(script) as upstream, gemini(upstream.gemini_url) as (g, events):
        await g.send_user_text("look it up")
        await g.respond()
        assert await events.until(CallsCancelled) == [
            TurnStarted(),
            CallRequested("c1", "slow_lookup", {}),
            TurnDone("completed"),
            CallsCancelled(("c1",)),
        ]
        await g.send_tool_output("c1", "slow_lookup", {"found": True})

        await g.send_user_text("and now?")
        await g.respond()
        # The cancelled turn's own turnComplete starts and ends nothing.
        after = await events.until(TurnDone)
        assert steps(after) == ["TurnStarted", "TurnDone"]
        assert text(after) == "Done."
        assert upstream.received("toolResponse") == []
        assert upstream.function_outputs == {}
        assert_healthy(upstream)


async def test_speaking_over_the_model_is_speech_started_and_a_cancelled_turn() -> None:
    script = [Say("A long answer that the user will interrupt."), Say("Okay.")]
    async with (
        RealtimeUpstream(script, transcripts=["stop"], realtime=True) as upstream,
        gemini(upstream.gemini_url) as (g, events),
    ):
        await g.send_user_text("tell me a story")
        await g.respond()
        await events.until(AudioDelta)
        chunks = utterance(16000)
        await g.send_audio(chunks[0])  # 100 ms of speech: the upstream's VAD hears it
        interrupted = await events.until(TurnDone)
        assert without_deltas(interrupted)[-2:] == ["SpeechStarted", "TurnDone"]
        assert interrupted[-2] == SpeechStarted(100)
        assert interrupted[-1] == TurnDone("cancelled")

        for chunk in chunks[1:]:
            await g.send_audio(chunk)
        answer = await events.until(TurnDone)
        assert steps(answer) == ["UserTranscript", "TurnStarted", "TurnDone"]
        assert UserTranscript("stop") in answer
        assert text(answer) == "Okay."
        assert_healthy(upstream)


async def test_text_sent_during_a_turn_cancels_it_without_speech() -> None:
    script = [Say("A long answer that new text will cut short."), Say("Second.")]
    async with (
        RealtimeUpstream(script, realtime=True) as upstream,
        gemini(upstream.gemini_url) as (g, events),
    ):
        await g.send_user_text("tell me a story")
        await g.respond()
        await events.until(AudioDelta)
        await g.send_user_text("never mind")
        await g.respond()
        cut = await events.until(TurnDone)
        assert cut[-1] == TurnDone("cancelled")
        assert not [e for e in cut if isinstance(e, SpeechStarted)]  # no one spoke
        answer = await events.until(TurnDone)
        assert steps(answer) == ["TurnStarted", "TurnDone"]
        done = answer[-1]
        assert isinstance(done, TurnDone)
        assert (text(answer), done.status) == ("Second.", "completed")
        assert_healthy(upstream)


async def test_go_away_then_the_close_is_an_expiry() -> None:
    async with (
        RealtimeUpstream([Say("Hi.")], goaway_after_responses=1, goaway_time_left_s=0.2) as up,
        gemini(up.gemini_url) as (g, events),
    ):
        await g.send_user_text("hello")
        await g.respond()
        await events.until(TurnDone)
        rest = await events.rest()
        assert isinstance(rest[0], Resumable)
        assert rest[1:] == [
            GoingAway(0.2),
            Closed("1000 Session time limit reached.", expired=True),
        ]
        with pytest.raises(ProviderError):
            await g.send_audio(speech(100, 16000))
        with pytest.raises(ProviderError):
            await g.respond()


async def test_a_close_without_go_away_is_no_expiry() -> None:
    async with (
        RealtimeUpstream([Say("Hi.")], max_responses=1) as upstream,
        gemini(upstream.gemini_url) as (g, events),
    ):
        await g.send_user_text("hello")
        await g.respond()
        rest = await events.rest()
        assert rest[-1] == Closed("1008 The operation was aborted.", expired=False)


@pytest.mark.parametrize(
    ("time_left", "seconds"),
    [("50s", 50.0), ("0.2s", 0.2), ("1.500000000s", 1.5), ("7", 7.0), ({"seconds": 3}, 3.0)],
)
def test_go_away_durations(time_left: Any, seconds: float) -> None:
    assert _seconds(time_left) == pytest.approx(seconds)


async def test_a_resumption_handle_continues_the_session_on_a_new_socket() -> None:
    async with RealtimeUpstream([Say("First."), Say("Second.")]) as upstream:
        async with gemini(upstream.gemini_url) as (g, events):
            await g.send_user_text("remember the code 1234")
            await g.respond()
            handle = (await events.until(Resumable))[-1]
            assert isinstance(handle, Resumable)
        history = upstream.connections[0].history
        assert [content["role"] for content in history] == ["user", "model"]

        # The history is in the resumed session: it is not seeded again.
        resumed = UpstreamSetup(
            instructions="Be brief.",
            history=(UserTurn(text="remember the code 1234"), AssistantTurn(text="First.")),
            resume_handle=handle.handle,
        )
        async with gemini(upstream.gemini_url, resumed) as (g, events):
            await g.send_user_text("what was the code?")
            await g.respond()
            answer = await events.until(TurnDone)
            assert audio(answer) == tone("Second.", 24000)
        second = upstream.connections[1]
        assert second.received[0]["setup"]["sessionResumption"] == {"handle": handle.handle}
        assert len(second.received_of("clientContent")) == 1
        assert second.history[:2] == history

        with pytest.raises(ProviderError, match="Requested entity was not found"):
            async with gemini(
                upstream.gemini_url, UpstreamSetup(instructions="", resume_handle="x")
            ):
                pass
        assert_healthy(upstream)


async def test_the_history_seeds_a_new_session_without_an_answer() -> None:
    items = (
        UserTurn(text="what is my battery level"),
        AssistantTurn(
            text="Let me check.",
            calls=(RequestedCall(call_id="g1", name="get_battery_level", args={}),),
        ),
        ToolOutcome(call_id="g1", name="get_battery_level", output={"level": 80}),
        AssistantTurn(text="80 percent."),
        ContextNote(text=completion_note("lookup_order", output="shipped"), call_id="g2"),
        UserTurn(text="and the weather?"),
        AssistantTurn(calls=(RequestedCall(call_id="g3", name="weather", args={"city": "Oslo"}),)),
    )
    async with (
        RealtimeUpstream([Say("Sunny.")]) as upstream,
        gemini(upstream.gemini_url, UpstreamSetup(instructions="Be brief.", history=items)) as (
            g,
            events,
        ),
    ):
        await g.send_user_text("thanks")
        await g.respond()
        answer = await events.until(TurnDone)
        assert text(answer) == "Sunny."  # the seed was not answered: the script's first turn

        seed, asked = upstream.received("clientContent")
        assert seed == {
            "clientContent": {
                "turns": [
                    {"role": "user", "parts": [{"text": "what is my battery level"}]},
                    {
                        "role": "model",
                        "parts": [
                            {"text": "Let me check."},
                            {"functionCall": {"id": "g1", "name": "get_battery_level", "args": {}}},
                        ],
                    },
                    {
                        "role": "user",
                        "parts": [
                            {
                                "functionResponse": {
                                    "id": "g1",
                                    "name": "get_battery_level",
                                    "response": {"level": 80},
                                }
                            }
                        ],
                    },
                    {"role": "model", "parts": [{"text": "80 percent."}]},
                    {
                        "role": "user",
                        "parts": [
                            {
                                "text": "<context>function [lookup_order] completed with response"
                                ' "shipped"</context>'
                            },
                            {"text": "and the weather?"},
                        ],
                    },
                    {
                        "role": "model",
                        "parts": [{"text": '(I called weather with {"city":"Oslo"}.)'}],
                    },
                ],
                "turnComplete": False,
            }
        }
        assert asked["clientContent"]["turnComplete"] is True
        assert upstream.turns_played == 1
        assert_healthy(upstream)


async def test_texts_and_context_go_as_one_user_turn_on_respond() -> None:
    async with RealtimeUpstream([Say("Noted.")]) as up, gemini(up.gemini_url) as (g, events):
        await g.send_user_text("hello")
        await g.send_context("the order shipped")
        await g.clear_audio()
        await g.cancel()
        await g.truncate(100)
        assert up.received("clientContent") == []  # buffered until respond
        await g.respond()
        answer = await events.until(TurnDone)
        assert text(answer) == "Noted."
        assert up.received("clientContent") == [
            {
                "clientContent": {
                    "turns": [
                        {
                            "role": "user",
                            "parts": [
                                {"text": "hello"},
                                {"text": "<context>the order shipped</context>"},
                            ],
                        }
                    ],
                    "turnComplete": True,
                }
            }
        ]

        await g.respond()  # nothing buffered: a bare turnComplete asks for an answer
        again = await events.until(TurnDone)
        assert text(again) == FALLBACK.text
        assert up.received("clientContent")[-1] == {"clientContent": {"turnComplete": True}}
        assert_healthy(up)


async def test_no_setup_complete_in_time_is_a_provider_error() -> None:
    async def silent(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async with serve(silent, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        adapter = GeminiLiveUpstream(
            url=f"ws://127.0.0.1:{port}/", model="models/x", api_key=None, connect_timeout=0.3
        )
        with pytest.raises(ProviderError, match="setupComplete"):
            await adapter.open(UpstreamSetup(instructions=""))
        with pytest.raises(ProviderError):
            await adapter.send_user_text("hello")


# --- aimock (a third party's Gemini Live mock: text and tool calls only) ---------------------

AIMOCK_FIXTURES = Path(__file__).parent / "data" / "aimock" / "realtime.json"
GEMINI_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"


def aimock() -> AbstractAsyncContextManager[str]:
    """aimock with the realtime fixtures (the file: the folder's other fixtures would
    answer every tool output); its base URL."""
    return run_aimock(fixtures=AIMOCK_FIXTURES)


@pytest.mark.skipif(
    not os.environ.get("CI") and (not CLI.exists() or shutil.which("node") is None),
    reason="aimock is not installed (make test installs it with npm into .aimock/)",
)
async def test_aimock_text_a_tool_call_and_an_unmatched_turn() -> None:
    async with aimock() as base:
        url = base.replace("http://", "ws://") + GEMINI_PATH
        setup = UpstreamSetup(instructions="Be brief.", tools=TOOLS)
        async with gemini(url, setup, model="gemini-2.0-flash") as (g, events):
            await g.send_user_text("hello")
            await g.respond()
            greeting = await events.until(TurnDone)
            assert without_deltas(greeting) == ["TurnStarted", "TurnDone"]
            assert text(greeting) == "Hello! How can I help you today?"

            await g.send_user_text("what is my battery level")
            await g.respond()
            called = await events.until(TurnDone)
            assert kinds(called) == ["TurnStarted", "CallRequested", "TurnDone"]
            call = called[1]
            assert isinstance(call, CallRequested)
            assert (call.name, call.args) == ("get_battery_level", {})
            await g.send_tool_output(call.call_id, call.name, {"level": 80})
            await g.respond()
            # aimock's turnComplete after its toolCall ends nothing: the next turn is the answer.
            answer = await events.until(TurnDone)
            assert without_deltas(answer) == ["TurnStarted", "TurnDone"]
            assert text(answer) == "Your battery is at 80 percent."

            await g.send_user_text("something no fixture matches")
            await g.respond()
            failed = await events.until(TurnDone)
            assert failed == [TurnStarted(), TurnDone("failed", error="No fixture matched")]

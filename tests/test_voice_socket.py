"""Voice on the v1 socket, end to end: synthesized speech in as binary frames over a real
socket, through the real gateway and its speech workers, the answer's audio back.

The Python SDK is the client (``connect(url, audio=...)``, ``send_audio``, ``audio()``).
Speech is piper's (the offline TTS, loaded once per module); what comes back is transcribed
by pocketsphinx. Each gateway runs one speech worker: a worker loads the engines in about
2 s, and these tests start a gateway each (the event loop is per test).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from client_sdk import Conversation, connect
from gateway.agent.file import DEMO_AGENT
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.v1 import (
    AudioDone,
    AudioFlush,
    Error,
    InputAudioCleared,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscript,
    Outbound,
    Ping,
    Pong,
    ResponseCreated,
    ResponseDone,
    ResponseTruncated,
    SessionUpdated,
    TextDone,
    TextSegment,
    ToolCalls,
)
from tests.mock_llm import MockLLM, mock_llm
from tests.proxy import proxy_to
from tests.support import Gateway, serving, session
from tests.test_truncate import assistant_texts
from tests.voice_support import (
    answer_as_the_demo_device,
    chunks,
    echo_of,
    rms,
    say_in_real_time,
    speech_edges_ms,
    spoken,
    transcribe,
)

pytestmark = pytest.mark.slow

VOICE_AGENT = Path(__file__).parent / "data" / "voice_agent.toml"
WAIT = 60.0
"""Seconds any one wait may take: the first waits include the worker's start."""
SILENCE = b"\0\0" * 16000  # 1 s at 16 kHz


async def say_out_loud(conv: Conversation, pcm: bytes, rate: int = 16000) -> None:
    """Send ``pcm`` in 20 ms binary frames, as a microphone would (as fast as the socket
    takes them: the gateway paces a fast sender itself)."""
    for chunk in chunks(pcm, rate, 20):
        await conv.send_audio(chunk)


def _final(event: Outbound) -> bool:
    return isinstance(event, InputTranscript) and event.final


def _cleared(event: Outbound) -> bool:
    return isinstance(event, InputAudioCleared)


async def until(
    events: AsyncIterator[Outbound],
    match: type | Callable[[Outbound], bool],
    seen: list[Outbound],
) -> Any:
    """Read ``events`` into ``seen`` up to the first that ``match`` (a type, or a test)
    finds; return it."""
    test = match if not isinstance(match, type) else (lambda e: isinstance(e, match))
    async with asyncio.timeout(WAIT):
        async for event in events:
            seen.append(event)
            if test(event):
                return event
    raise AssertionError(f"no event like {match}")


class Speaker:
    """The answers' frames as a client's player gets them (``Conversation.audio``), and a
    wait until so much audio came: frames go ahead of ``audio.done`` on the socket, but the
    app reads them from their own stream, maybe later."""

    def __init__(self, audio: AsyncIterator[AnswerAudio], rate: int) -> None:
        self.frames: list[AnswerAudio] = []
        self._rate = rate
        self._more = asyncio.Condition()
        self._task = asyncio.create_task(self._read(audio))

    async def _read(self, audio: AsyncIterator[AnswerAudio]) -> None:
        async for frame in audio:
            self.frames.append(frame)
            async with self._more:
                self._more.notify_all()

    @property
    def ms(self) -> int:
        return sum(len(f.pcm) for f in self.frames) * 1000 // (2 * self._rate)

    async def until_ms(self, ms: int) -> None:
        async with self._more, asyncio.timeout(WAIT):
            await self._more.wait_for(lambda: self.ms >= ms)

    def stop(self) -> None:
        self._task.cancel()


def before_next_turn(seen: list[Outbound]) -> list[Outbound]:
    """The events before the second turn's start: the later turn may itself stop an answer
    still playing (as it should), the sounds before it must not."""
    starts = [n for n, e in enumerate(seen) if isinstance(e, InputSpeechStarted)]
    return seen[: starts[1]] if len(starts) > 1 else seen


async def collect(
    audio: AsyncIterator[AnswerAudio],
    into: list[AnswerAudio],
    played: tuple[int, asyncio.Event] | None = None,
) -> None:
    """Read the answer's frames into ``into``; with ``played``, set its event once that
    many bytes of audio came."""
    async for frame in audio:
        into.append(frame)
        if played is not None and sum(len(f.pcm) for f in into) >= played[0]:
            played[1].set()


# ----------------------------------------------------------------- a spoken turn


async def test_a_spoken_question_gets_the_call_and_a_spoken_answer(tts, stt):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url, audio={"output_rate": 24000}) as conv,
    ):

        @conv.client_function("get_battery_level")
        async def battery() -> dict[str, Any]:
            return {"level": 0.82, "charging": False}

        created = await conv.start()
        assert created.audio is not None
        assert (created.audio.input_rate, created.audio.output_rate) == (16000, 24000)
        events, speaker = conv.events(), Speaker(conv.audio(), 24000)
        await say_out_loud(conv, spoken(tts, "what's my battery level?"))
        seen: list[Outbound] = []
        done = await until(events, AudioDone, seen)
        await speaker.until_ms(done.audio_ms)  # every frame, as audio.done says
        speaker.stop()
        frames = speaker.frames

    kinds = [type(e) for e in seen]
    assert kinds.index(InputSpeechStarted) < kinds.index(InputSpeechStopped)
    started = next(e for e in seen if isinstance(e, InputSpeechStarted))
    stopped = next(e for e in seen if isinstance(e, InputSpeechStopped))
    assert 200 <= started.offset_ms < stopped.offset_ms  # 300 ms of silence first
    final = next(e for e in seen if isinstance(e, InputTranscript) and e.final)
    assert "battery" in final.text
    assert final.message_id is not None
    calls = next(e for e in seen if isinstance(e, ToolCalls))
    assert calls.calls[0].tool == "get_battery_level"
    text = next(e for e in seen if isinstance(e, TextDone)).text
    assert "82%" in text
    assert ResponseDone in kinds
    assert TextSegment in kinds

    # Every frame before audio.done, in order, of this response, non-silent.
    response_id = done.response_id
    assert frames
    assert all(f.response_id == response_id for f in frames)
    pcm = b"".join(f.pcm for f in frames)
    assert done.status == "completed"
    assert done.audio_ms == len(pcm) * 1000 // (2 * 24000)
    offsets = [f.offset_ms for f in frames]
    assert offsets == sorted(offsets)
    assert offsets[0] == 0
    segment_seqs = {e.seq for e in seen if isinstance(e, TextSegment)}
    assert {f.seq for f in frames} <= segment_seqs
    assert rms(pcm) > 300
    # As long as the same words synthesized here (piper varies a little: 25 %).
    alone = b"".join(tts.synthesize(text, 24000))
    assert abs(len(pcm) - len(alone)) <= 0.25 * len(alone)
    heard = transcribe(stt, pcm, 24000)
    assert "battery" in heard or "eighty" in heard, heard


async def test_manual_turns_end_at_commit_and_clear_drops_the_audio(tts):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url, audio={"turn_detection": "manual"}) as conv,
    ):
        await conv.start()
        events = conv.events()
        await say_out_loud(conv, spoken(tts, "open the settings"))
        await conv.clear_audio()
        seen: list[Outbound] = []
        await until(events, _cleared, seen)
        await say_out_loud(conv, spoken(tts, "nearest store to 92031"))
        await conv.commit_audio()
        final = await until(events, _final, seen)
        assert "store" in final.text
        assert "settings" not in final.text
        assert not any(isinstance(e, InputSpeechStarted | Error) for e in seen)
        await until(events, ResponseDone, seen)


# ----------------------------------------------------------------- barge-in (llmock)

LONG_ANSWER = (
    "The weather today is sunny and warm across the whole region. In the afternoon a light"
    " breeze will come in from the west, and the evening stays clear and mild."
)


@pytest.fixture
async def llm_voice() -> AsyncIterator[tuple[MockLLM, Gateway]]:
    async with (
        mock_llm() as llm,
        serving(
            agent=str(VOICE_AGENT),
            model="openai:mock-model",
            base_url=llm.base_url("openai"),
            voice_workers=1,
        ) as gateway,
    ):
        yield llm, gateway


async def test_speaking_over_the_answer_cancels_it_and_the_history_keeps_what_played(
    tts, llm_voice
):
    llm, gateway = llm_voice
    # The first answer stalls after its first sentence (as a slow model would): it is still
    # running when the user speaks over it.
    await llm.script(
        {"type": "reply", "text": LONG_ANSWER},
        {"type": "stream_fault", "kind": "stall", "after_chunks": 14, "stall_seconds": 30},
        {"type": "reply", "text": "Okay."},
    )
    async with connect(gateway.url, audio={}) as conv:
        await conv.start()
        events, frames = conv.events(), list[AnswerAudio]()
        second_out = asyncio.Event()  # 1 s of the answer (at 24 kHz) is out
        reading = asyncio.create_task(collect(conv.audio(), frames, (48000, second_out)))
        await say_out_loud(conv, spoken(tts, "what's the weather like?"))
        seen: list[Outbound] = []
        segment = await until(events, TextSegment, seen)
        async with asyncio.timeout(WAIT):
            await second_out.wait()
        await say_out_loud(conv, spoken(tts, "stop, what about tomorrow?"))
        flush = await until(events, AudioFlush, seen)
        assert flush.response_id == segment.response_id
        played_ms = len(b"".join(f.pcm for f in frames)) * 1000 // (2 * 24000)
        await conv.truncate(audio_end_ms=played_ms - 200)
        truncated = await until(events, ResponseTruncated, seen)
        done = next(e for e in seen if isinstance(e, ResponseDone))
        assert (done.response_id, done.status) == (segment.response_id, "cancelled")
        audio_done = next(e for e in seen if isinstance(e, AudioDone))
        assert audio_done.status == "interrupted"
        await until(events, _final, seen)
        await until(events, AudioDone, seen)  # the answer to the new turn, spoken
        reading.cancel()

    heard = truncated.heard_chars
    assert 0 < heard < len(segment.text) + 1
    first, second = (await llm.requests())[:2]
    assert assistant_texts(second.body, "openai") == [LONG_ANSWER[:heard]]
    assert LONG_ANSWER[heard - 1] != " "
    assert LONG_ANSWER[heard] in " ,."
    del first


async def test_the_answer_played_back_into_the_microphone_does_not_interrupt_it(tts):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url, audio={}) as conv,
    ):
        await conv.start()
        events, seen, frames = conv.events(), list[Outbound](), list[AnswerAudio]()
        reading = asyncio.create_task(collect(conv.audio(), frames))
        await say_out_loud(conv, spoken(tts, "do you have headphones in stock?"))
        done = await until(events, AudioDone, seen)
        reading.cancel()
        # The device plays it (the gateway sends faster than it plays): its sound comes
        # back into the microphone, 120 ms late, at 30 %, while it plays.
        played = b"".join(f.pcm for f in frames)
        await say_out_loud(conv, echo_of(played, 24000, delay_ms=120, scale=0.3))
        # Then the user speaks: once that is heard, all of the echo was.
        await say_out_loud(conv, spoken(tts, "open the settings"))
        await until(events, lambda e: _final(e) and "settings" in str(e), seen)
    assert done.status == "completed"
    assert not any(isinstance(e, AudioFlush) for e in before_next_turn(seen))
    finals = [e.text for e in seen if isinstance(e, InputTranscript) and e.final]
    assert len(finals) == 2, finals  # the question and the next turn: no turn of echo
    assert len(finals[1].split()) <= 4, finals  # "open the settings": none of the echo's words
    assert sum(isinstance(e, InputSpeechStarted) for e in seen) == 2
    first_done = next(e for e in seen if isinstance(e, ResponseDone))
    assert first_done.status == "completed"
    assert len(played) > 48000  # over a second of answer came back


# ----------------------------------------------------------------- settings and bad input


async def test_audio_settings_are_echoed_as_applied_or_refused():
    async with (
        serving(agent=str(DEMO_AGENT), voice_workers=1) as gateway,
        connect(gateway.url) as conv,
    ):
        created = await conv.start()
        assert created.audio is None
        events, seen = conv.events(), list[Outbound]()
        await conv.update(
            audio={
                "input_rate": 24000,
                "output_rate": 16000,
                "voice": "joe",
                "turn_detection": "semantic",
                "silence_ms": 700,
                "interrupt_min_ms": 300,
            }
        )
        updated = await until(events, SessionUpdated, seen)
        assert updated.audio is not None
        assert (
            updated.audio.input_rate,
            updated.audio.output_rate,
            updated.audio.voice,
            updated.audio.turn_detection,
            updated.audio.silence_ms,
            updated.audio.interrupt_min_ms,
        ) == (24000, 16000, "joe", "semantic", 700, 300)
        await conv.update(audio={"voice": "nobody"})
        refused = await until(events, Error, seen)
        assert refused.code == "invalid_message"
        assert "voice" in refused.message
        await conv.update(audio=False)
        off = await until(events, SessionUpdated, seen)
        assert off.audio is None


async def test_bad_audio_gets_an_error_and_the_session_lives(tts):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url) as conv,
    ):
        await conv.start()
        events, seen = conv.events(), list[Outbound]()
        await conv.send_audio(b"\0\0" * 320)  # audio is off
        off = await until(events, Error, seen)
        assert off.code == "invalid_audio"
        assert "off" in off.message
        await conv.commit_audio()
        assert (await until(events, Error, seen)).code == "invalid_audio"
        await conv.update(audio={"input_rate": 16000})
        await until(events, SessionUpdated, seen)
        await conv.send_audio(b"\0\0\0")  # odd: half a sample
        odd = await until(events, Error, seen)
        assert odd.code == "invalid_audio"
        assert "2-byte" in odd.message
        await conv.send_audio(b"\0\0" * 16000)  # 1 s in one frame
        big = await until(events, Error, seen)
        assert big.code == "message_too_large"
        assert "250 ms" in big.message
        await conv.commit_audio()  # nothing to commit
        assert (await until(events, Error, seen)).code == "invalid_audio"
        # The session lives, and hears the next turn.
        await say_out_loud(conv, spoken(tts, "open the settings"))
        final = await until(events, _final, seen)
        assert "settings" in final.text
        await until(events, ResponseDone, seen)


async def test_a_gateway_without_speech_engines_refuses_audio():
    async with (
        serving(agent=str(DEMO_AGENT), voice="off") as gateway,
        connect(gateway.url) as conv,
    ):
        await conv.start()
        events, seen = conv.events(), list[Outbound]()
        await conv.update(audio={})
        refused = await until(events, Error, seen)
        assert refused.code == "audio_unavailable"
        await conv.send_audio(b"\0\0" * 320)
        assert (await until(events, Error, seen)).code == "invalid_audio"


# ----------------------------------------------------------------- many sessions speaking

SPEAKERS = 20


async def test_twenty_sessions_speak_and_another_sessions_pings_stay_quick(tts):
    """The engines run in worker processes, never on the event loop: while 20 sessions
    speak at once (each a phrase, paced as a microphone), another session's pings are
    answered within 50 ms, and every speaker gets its answer spoken."""
    clips = [spoken(tts, phrase) for phrase in ("open the settings", "what's my battery level?")]
    async with serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=2) as gateway:
        speaking = asyncio.Event()

        async def speaker(n: int) -> AudioDone:
            async with connect(gateway.url, audio={}) as conv:
                answer_as_the_demo_device(conv)
                await conv.start()
                events, seen = conv.events(), list[Outbound]()
                await speaking.wait()
                await say_in_real_time(conv, clips[n % len(clips)])
                done: AudioDone = await until(events, AudioDone, seen)
                return done

        async def pinger(rtts: list[float]) -> None:
            async with session(gateway.url) as (conn, _):
                loop = asyncio.get_running_loop()
                while True:
                    sent = loop.time()
                    await conn.send(Ping(ts=sent))
                    await conn.recv_until(lambda e: isinstance(e, Pong))
                    rtts.append(loop.time() - sent)
                    await asyncio.sleep(0.05)  # a ping every 50 ms: the probe's own pace

        rtts: list[float] = []
        speakers = [asyncio.create_task(speaker(n)) for n in range(SPEAKERS)]
        probe = asyncio.create_task(pinger(rtts))
        speaking.set()
        async with asyncio.timeout(180):
            done = await asyncio.gather(*speakers)
        probe.cancel()
    assert [d.status for d in done] == ["completed"] * SPEAKERS
    assert all(d.audio_ms > 500 for d in done)
    assert len(rtts) > 20
    assert max(rtts) < 0.05, sorted(rtts)[-5:]


# ----------------------------------------------------------------- async results, resume


async def test_an_async_result_that_arrives_while_idle_is_spoken(tts):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url, audio={}) as conv,
    ):
        await conv.start()
        events, seen = conv.events(), list[Outbound]()
        # Typed or spoken, the same: a when_idle async tool answers later, on its own.
        async for _ in conv.say("where is my order 1234?"):
            pass
        first = await until(events, AudioDone, seen)
        later = await until(
            events, lambda e: isinstance(e, ResponseCreated) and e.call_id is not None, seen
        )
        spoken_later = await until(
            events, lambda e: isinstance(e, AudioDone) and e.response_id == later.response_id, seen
        )
    assert first.status == spoken_later.status == "completed"
    assert spoken_later.audio_ms > 500


class SentEvents:
    """A session observer (``Driver.add_observer``) that wakes the test on an event type."""

    def __init__(self, kind: type) -> None:
        self.kind, self.seen = kind, asyncio.Event()

    def sent(self, msg: Any, now: float) -> None:
        if isinstance(msg, self.kind):
            self.seen.set()

    def started(self, now: float) -> None: ...
    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None: ...
    def detached(self, *, ended: bool, now: float) -> None: ...
    def ended(self, now: float) -> None: ...


async def test_a_resumed_voice_session_gets_the_events_it_missed_and_not_the_old_audio(tts):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        proxy_to(gateway.port) as proxy,
        connect(proxy.url(), audio={}, attempt_timeout=0.3, max_reconnect_delay=0.3) as conv,
    ):
        created = await conv.start()
        answer_sent = SentEvents(AudioDone)
        gateway.runtime.drivers[created.session_id].add_observer(answer_sent)
        events, seen, frames = conv.events(), list[Outbound](), list[AnswerAudio]()
        reading = asyncio.create_task(collect(conv.audio(), frames))
        # Words no rule of the demo's model matches: its long answer, and no tool (a client
        # function's call would wait for the client meanwhile).
        await say_out_loud(conv, spoken(tts, "good morning to you"))
        # The socket drops as the user's words come back (the answer's audio is not made
        # yet: piper takes 100 ms or more), and the resume is held back until the gateway
        # has sent the whole answer, its audio into no socket.
        await until(events, _final, seen)
        proxy.mode = "mute"
        proxy.drop()
        async with asyncio.timeout(WAIT):
            await answer_sent.seen.wait()
        proxy.mode = "pass"
        done = await until(events, AudioDone, seen)
        reading.cancel()
    seqs = [e.seq for e in seen if e.seq]
    assert len(seqs) == len(set(seqs))  # each event once, the replayed ones included
    assert any(isinstance(e, InputTranscript) and e.final for e in seen)
    assert any(isinstance(e, TextDone) for e in seen)
    assert done.audio_ms > 500
    assert frames == []  # the audio sent meanwhile is not replayed: its text is
    assert any(isinstance(e, TextSegment) for e in seen)


async def test_a_sound_shorter_than_interrupt_min_ms_does_not_stop_the_answer(tts):
    question = spoken(tts, "good morning to you")  # the demo's long answer, no tool
    words = b"".join(tts.synthesize("what's my battery level", 16000))
    start, end = speech_edges_ms(words, 16000)
    middle = (start + end) // 2 * 32  # byte offset at 16 kHz
    cough = words[middle : middle + 180 * 32]  # 180 ms of voice
    later = spoken(tts, "open the settings")
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url, audio={"interrupt_min_ms": 300}) as conv,
    ):
        await conv.start()
        events, seen, frames = conv.events(), list[Outbound](), list[AnswerAudio]()
        first_frame = asyncio.Event()
        reading = asyncio.create_task(collect(conv.audio(), frames, (1, first_frame)))
        await say_out_loud(conv, question)
        async with asyncio.timeout(WAIT):
            await first_frame.wait()
        await say_out_loud(conv, cough + SILENCE)  # over the answer, as it starts to play
        done = await until(events, AudioDone, seen)
        # Then a real turn: once it is heard, the cough was too.
        await say_out_loud(conv, later)
        await until(events, lambda e: _final(e) and "settings" in str(e), seen)
        reading.cancel()
    assert done.status == "completed"
    assert not any(isinstance(e, AudioFlush) for e in before_next_turn(seen))
    starts = [e.offset_ms for e in seen if isinstance(e, InputSpeechStarted)]
    question_ms = len(question) * 1000 // 32000
    cough_end_ms = question_ms + (len(cough) + len(SILENCE)) * 1000 // 32000
    assert len(starts) == 2, starts  # the question and the later turn: not the cough
    assert starts[0] < question_ms <= cough_end_ms <= starts[1]


async def test_a_session_at_24_khz_in_and_16_khz_out(tts):
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, voice_workers=1) as gateway,
        connect(gateway.url, audio={"input_rate": 24000, "output_rate": 16000}) as conv,
    ):

        @conv.client_function("get_battery_level")
        async def battery() -> dict[str, Any]:
            return {"level": 0.5, "charging": True}

        await conv.start()
        events, seen, speaker = conv.events(), list[Outbound](), Speaker(conv.audio(), 16000)
        await say_out_loud(conv, spoken(tts, "what's my battery level?", 24000), 24000)
        final = await until(events, _final, seen)
        done = await until(events, AudioDone, seen)
        await speaker.until_ms(done.audio_ms)
        speaker.stop()
    assert "battery" in final.text
    assert speaker.ms == done.audio_ms > 1000  # 16 kHz frames, as much as audio.done says

"""The speech engines in worker processes (gateway/voice/workers.py), with the real offline
engines: a synthesis fed back through a pinned transcription with VAD, an engine's error on a
live stream, a cancelled synthesis, a killed worker replaced, and the event loop kept free;
a stream whose VAD hears everything and its recognizer one utterance after another, and its
echo gate fed the answer's audio.

Each test starts its own pool (the project's async fixtures are function-scoped); a worker
loads the offline engines in about 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest

from gateway.voice.base import Transcript
from gateway.voice.workers import SpeechEngineError, VoiceWorkers
from tests.voice_support import LONG_PHRASES, chunks, echo_of

pytest.importorskip("piper")
pytest.importorskip("pocketsphinx")

RATE = 16000
QUESTION = "what's my battery level?"
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long answer about the battery." for n in range(12)
)
"""Many sentences: piper yields one chunk per sentence, so its synthesis is many chunks."""


@contextlib.asynccontextmanager
async def pool(processes: int = 2) -> AsyncIterator[VoiceWorkers]:
    workers = await VoiceWorkers.start(processes=processes)
    try:
        yield workers
    finally:
        await workers.aclose()


async def speak(workers: VoiceWorkers, text: str) -> bytes:
    return b"".join([pcm async for pcm in workers.synthesize(text, RATE)])


def silence(ms: int) -> bytes:
    return bytes(RATE * ms // 1000 * 2)


async def test_speech_round_trip_with_vad_and_an_odd_chunk_on_the_same_stream():
    async with pool() as workers:
        speech = await speak(workers, QUESTION)
        assert len(speech) > RATE * 2 // 2  # over half a second of audio
        audio = silence(500) + speech + silence(700)
        stream = await workers.open_transcription(vad=True)
        assert (stream.sample_rate, stream.frame_samples) == (RATE, 512)
        parts = chunks(audio, RATE, 20)
        half = len(parts) // 2
        probabilities: list[float] = []
        for part in parts[:half]:
            probabilities += (await stream.hear(part)).probabilities
        with pytest.raises(ValueError, match="odd length"):
            await stream.hear(b"\x01\x02\x03")
        for part in parts[half:]:
            probabilities += (await stream.hear(part)).probabilities
        final = await stream.finish()
        # A stream not wanted any more is closed: its decoder is freed, once.
        dropped = await workers.open_transcription()
        await dropped.feed(speech[: RATE // 5 * 2])
        await dropped.aclose()
        await dropped.aclose()
        with pytest.raises(RuntimeError, match="already finished"):
            await dropped.finish()

    assert final.final
    assert "battery" in final.text
    # Every whole 32 ms frame, and only those: the odd chunk counted for nothing.
    assert len(probabilities) == len(audio) // 1024
    assert sum(p > 0.5 for p in probabilities) >= 10  # about 1.2 s of speech: ~37 frames
    assert max(probabilities[:10]) < 0.5  # the first 320 ms of the 500 ms of silence
    assert max(probabilities[-10:]) < 0.5  # the last 320 ms of the 700 ms


async def test_a_cancelled_synthesis_stops_and_the_worker_speaks_again():
    async with pool(processes=1) as workers:
        # Left early: the worker stops after its current chunk.
        async with contextlib.aclosing(workers.synthesize(LONG_TEXT, RATE)) as speech:
            first = await anext(speech)
        assert first
        # Cancelled while waiting for a chunk (barge-in cancels the task that plays).
        started = asyncio.Event()

        async def play() -> None:
            async for _ in workers.synthesize(LONG_TEXT, RATE):
                started.set()

        task = asyncio.create_task(play())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The same worker: the next synthesis has its own audio only (no late chunk of the
        # cancelled ones): "hello" is well under 2 s, the long text is over 30 s.
        hello = await speak(workers, "hello")
        assert 0 < len(hello) < RATE * 2 * 2


async def test_a_killed_worker_fails_its_request_and_is_replaced():
    async with pool(processes=1) as workers:
        [pid] = workers.pids

        async def speak_and_kill() -> None:
            async with contextlib.aclosing(workers.synthesize(LONG_TEXT, RATE)) as speech:
                await anext(speech)  # the synthesis is under way: kill its worker
                os.kill(pid, signal.SIGKILL)
                async for _ in speech:  # what it sent before it died, then the error
                    pass

        with pytest.raises(SpeechEngineError, match="died") as failure:
            await speak_and_kill()
        assert failure.value.retryable
        assert await speak(workers, "hello")  # on a new worker
        assert workers.pids != [pid]


async def test_the_event_loop_stays_responsive_while_two_workers_work():
    async with pool() as workers:
        question = await speak(workers, QUESTION)
        gaps: list[float] = []
        working = True

        async def tick() -> None:
            last = time.monotonic()
            while working:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async def transcribe() -> str:
            stream = await workers.open_transcription(vad=True)
            for part in chunks(silence(300) + question * 3 + silence(300), RATE, 20):
                await stream.hear(part)
            return (await stream.finish()).text

        ticker = asyncio.create_task(tick())
        spoken, heard = await asyncio.gather(speak(workers, LONG_TEXT), transcribe())
        working = False
        await ticker

    assert len(spoken) > RATE * 2 * 20  # both really worked
    assert "battery" in heard
    assert len(gaps) > 20
    assert max(gaps) < 0.05, f"largest gap between ticks {max(gaps) * 1000:.0f} ms"


async def test_engines_that_do_not_load_fail_the_start_with_the_reason():
    with pytest.raises(SpeechEngineError, match=r"did not start.*no_such_factory"):
        await VoiceWorkers.start(processes=1, engines="gateway.voice.offline:no_such_factory")


async def test_the_vad_and_the_recognizer_hear_what_they_are_given_utterance_after_utterance():
    async with pool(processes=1) as workers:
        [worker] = workers._workers
        speech = await speak(workers, QUESTION)
        audio = silence(300) + speech + silence(500)
        audio += bytes(-len(audio) % 1024)  # whole VAD frames: none left in the worker
        stream = await workers.open_transcription(vad=True)
        assert worker.streams == 1

        # The VAD alone: probabilities, no transcript, and no utterance to finish.
        probabilities: list[float] = []
        for part in chunks(audio, RATE, 20):
            heard = await stream.hear(part, stt=False)
            assert heard.transcript is None
            assert len(heard.echo) == len(heard.probabilities)
            probabilities += heard.probabilities
        assert len(probabilities) == len(audio) // 1024
        assert sum(p > 0.5 for p in probabilities) >= 10
        assert await stream.finish(keep=True) == Transcript("", final=True)

        # The recognizer alone: no probabilities, and the VAD's partial frame untouched.
        assert (await stream.hear(bytes(1000), stt=False)).probabilities == []
        partials = []
        for part in chunks(speech, RATE, 20):
            heard = await stream.hear(part, vad=False)
            assert (heard.probabilities, heard.echo) == ([], [])
            if heard.transcript is not None:
                partials.append(heard.transcript)
        first = await stream.finish(keep=True)
        # 1000 bytes carried + 48: one frame (the VAD never saw the speech in between).
        assert len((await stream.hear(bytes(48), stt=False)).probabilities) == 1
        assert partials
        assert not partials[-1].final

        # Both, on a new utterance: the first one's words are not heard again.
        for part in chunks(silence(100) + speech, RATE, 20):
            await stream.hear(part)
        second = await stream.finish(keep=True)
        assert worker.streams == 1

        # Closed with an utterance under way: everything is freed, once.
        await stream.hear(speech[: RATE // 5 * 2], vad=False)
        await stream.aclose()
        await stream.aclose()
        assert worker.streams == 0
        with pytest.raises(RuntimeError, match="already finished"):
            await stream.finish(keep=True)

    assert first.final
    assert "battery" in first.text
    assert second.final
    assert "battery" in second.text
    assert second.text.count("battery") == 1


async def test_the_echo_of_the_answer_is_told_from_the_user_speaking():
    async with pool(processes=1) as workers:
        answer = b"".join([pcm async for pcm in workers.synthesize(LONG_PHRASES[0], 24000)])
        user = await speak(workers, LONG_PHRASES[1])
        stream = await workers.open_transcription(vad=True)
        without_vad = await workers.open_transcription()
        with pytest.raises(ValueError, match="vad=True"):
            await without_vad.reference(answer[:4800], 24000)
        await without_vad.aclose()

        async def listen(pcm: bytes) -> list[tuple[float, bool]]:
            frames: list[tuple[float, bool]] = []
            for part in chunks(pcm, RATE, 20):
                heard = await stream.hear(part, stt=False)
                frames += zip(heard.probabilities, heard.echo, strict=True)
            return frames

        # No answer playing: the user's speech is never echo.
        alone = await listen(user)
        # The answer sent to the device at once (faster than real time), then its echo.
        for part in chunks(answer, 24000, 100):
            await stream.reference(part, 24000)
        echo = await listen(echo_of(answer, 24000, delay_ms=400))
        over = await listen(user)  # the user, the answer's audio still kept
        await stream.reset_reference()  # the playback was flushed
        after = await listen(echo_of(answer, 24000, delay_ms=400, seed=8))
        await stream.aclose()

    def speech(frames: list[tuple[float, bool]]) -> list[bool]:
        return [is_echo for probability, is_echo in frames if probability >= 0.5]

    assert not any(is_echo for probability, is_echo in echo if probability < 0.5)
    assert len(speech(echo)) >= 40
    # The echo's speech frames, but perhaps one or two in the noise after its end.
    assert sum(speech(echo)) >= len(speech(echo)) - 2
    for frames in (alone, over, after):
        assert len(speech(frames)) >= 40
        assert not any(speech(frames))

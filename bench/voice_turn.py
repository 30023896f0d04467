"""A spoken turn's latency and cost, over a real socket: the end of the user's speech to the
first byte of the answer's audio.

The gateway runs in this process on a free port with the demo agent (its scripted model at
its own pace, a word every 30 ms, about as fast as a hosted model streams) and the offline
speech engines in ``--workers`` worker processes. A client (the Python SDK) says each of the
demo's phrases, synthesized by piper, in 20 ms frames paced in real time, as a microphone
would, and records when each event and the first audio frame arrive. Per turn:

- **true end**: when the last sample of speech went out (the clip's speech edge, found by
  ``speech_edges_ms``), so *after true end* includes the turn detector's wait (``silence_ms``,
  500 ms in ``server_vad``; less in ``semantic`` when the words are complete);
- **speech_stopped -> first audio**, split into: *STT final* (speech_stopped to the final
  transcript), *model first delta* (the final transcript to the first ``text.delta``), *model*
  (the final transcript to the first ``text.segment``: the model's first words, up to a clause
  the TTS can speak), *TTS* (the first segment to the first audio frame);
- **engines alone**: the same finish and first chunk timed on the worker pool directly, with
  no session (``Transcription.finish`` after the clip; ``synthesize`` of the answer's first
  segment);
- **gateway's own**: from the moment the final transcript came back from the worker to the
  client having ``input_audio.transcript``, plus from the moment the first chunk of audio came
  back from the worker to the client having its first frame (the bench wraps
  ``Transcription.finish`` and ``VoiceWorkers.synthesize`` to note when they return: the
  engines' results in the gateway's hands), i.e. what the gateway adds on the path.

CPU: the gateway process and its workers (``/proc``), per second of conversation audio (the
user's and the answers'). Prints figures; asserts nothing.

    .venv/bin/python -m bench.voice_turn [rounds] [server_vad|semantic]
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import sys
import time
from typing import Any

from client_sdk import connect
from gateway.agent.file import DEMO_AGENT
from gateway.logging import configure_logging
from gateway.voice.offline import PiperTTS
from gateway.voice.workers import Transcription, VoiceWorkers
from gateway.wire.v1 import (
    AudioDone,
    InputSpeechStopped,
    InputTranscript,
    TextDelta,
    TextSegment,
)
from tests.support import serving
from tests.voice_support import (
    DEMO_PHRASES,
    answer_as_the_demo_device,
    chunks,
    say_in_real_time,
    speech_edges_ms,
)

__all__: list[str] = []

RATE = 16000
OUT_RATE = 24000
FRAME_MS = 20
_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


RETURNED: dict[str, list[float]] = {"finish": [], "chunk": []}
"""When (perf_counter) the gateway got each final transcript and each first chunk."""


def note_engine_results() -> None:
    """Wrap the worker pool's calls to note when the engines' results reach the gateway."""
    finish = Transcription.finish
    synthesize = VoiceWorkers.synthesize

    async def noted_finish(self: Transcription, *, keep: bool = False) -> Any:
        result = await finish(self, keep=keep)
        RETURNED["finish"].append(time.perf_counter())
        return result

    async def noted_synthesize(self: VoiceWorkers, *args: Any, **kwargs: Any) -> Any:
        first = True
        async for chunk in synthesize(self, *args, **kwargs):
            if first:
                RETURNED["chunk"].append(time.perf_counter())
                first = False
            yield chunk

    Transcription.finish = noted_finish  # type: ignore[method-assign]
    VoiceWorkers.synthesize = noted_synthesize  # type: ignore[method-assign]


def last_before(times: list[float], moment: float) -> float:
    return max((t for t in times if t <= moment), default=moment)


async def one_turn(
    conv: Any, pcm: bytes, speech_end_ms: int
) -> tuple[dict[str, float], str, int, int]:
    """Say ``pcm``; the arrival times (relative to the true end of speech), the first
    segment's text, the answer's audio ms and the user's audio ms."""
    events, audio = conv.events(), conv.audio()
    marks: dict[str, float] = {}
    first_segment = ""

    async def first_audio() -> None:
        async for _ in audio:
            marks.setdefault("audio", time.perf_counter())
            return

    async def watch_events() -> AudioDone:
        nonlocal first_segment
        async for event in events:
            now = time.perf_counter()
            match event:
                case InputSpeechStopped():
                    marks.setdefault("stopped", now)
                case InputTranscript(final=True):
                    marks.setdefault("final", now)
                case TextDelta():
                    marks.setdefault("delta", now)
                case TextSegment(text=text):
                    if "segment" not in marks:
                        marks["segment"], first_segment = now, text
                case AudioDone():
                    return event
        raise AssertionError("the session ended")

    watching = asyncio.create_task(first_audio())
    reading = asyncio.create_task(watch_events())
    start = await say_in_real_time(conv, pcm, RATE, FRAME_MS)
    async with asyncio.timeout(60):
        done = await reading
    await watching
    true_end = start + speech_end_ms / 1000
    marks["finish_back"] = last_before(RETURNED["finish"], marks["final"])
    marks["chunk_back"] = last_before(RETURNED["chunk"], marks["audio"])
    return (
        {name: at - true_end for name, at in marks.items()},
        first_segment,
        done.audio_ms,
        len(pcm) * 1000 // (2 * RATE),
    )


async def engines_alone(workers: VoiceWorkers, pcm: bytes, segment: str) -> tuple[float, float]:
    """(STT finish s, TTS first chunk s) of the engines on the pool, with no session."""
    stream = await workers.open_transcription(vad=True)
    for chunk in chunks(pcm, RATE, FRAME_MS):
        await stream.hear(chunk)
    began = time.perf_counter()
    await stream.finish()
    stt = time.perf_counter() - began
    began = time.perf_counter()
    synthesis = workers.synthesize(segment, OUT_RATE)
    await anext(synthesis)
    tts = time.perf_counter() - began
    await synthesis.aclose()
    return stt, tts


async def main(rounds: int, mode: str, processes: int) -> None:
    configure_logging("warning")
    note_engine_results()
    tts = PiperTTS()
    clips = {
        phrase: b"\0\0" * (RATE * 3 // 10) + b"".join(tts.synthesize(phrase, RATE))
        for phrase in DEMO_PHRASES
    }
    silence = b"\0\0" * (RATE * 12 // 10)  # the turn ends in it
    rows: list[dict[str, float]] = []
    alone: list[tuple[float, float]] = []
    said: list[tuple[bytes, str]] = []
    audio_ms = 0
    async with serving(agent=str(DEMO_AGENT), voice_workers=processes) as gateway:
        async with connect(gateway.url, audio={"turn_detection": mode}) as conv:
            answer_as_the_demo_device(conv)
            await conv.start()
            workers = await gateway.runtime.voice.workers()
            # A warm-up turn: the workers' decoders and the model's first answer.
            await one_turn(conv, clips["hello"] + silence, speech_edges_ms(clips["hello"], RATE)[1])
            pids = workers.pids
            cpu_before = self_cpu() + sum(proc_cpu(pid) for pid in pids)
            for _ in range(rounds):
                for clip in clips.values():
                    end = speech_edges_ms(clip, RATE)[1]
                    marks, segment, answer_ms, user_ms = await one_turn(conv, clip + silence, end)
                    rows.append(marks)
                    audio_ms += answer_ms + user_ms
                    said.append((clip + silence, segment))
            cpu = self_cpu() + sum(proc_cpu(pid) for pid in pids) - cpu_before
            for clip, segment in said:  # after the CPU count: the engines' own time
                alone.append(await engines_alone(workers, clip, segment))

    def column(name: str) -> list[float]:
        return [1000 * value for value in name_values(name)]

    def name_values(name: str) -> list[float]:
        legs = {
            "after true end": [r["audio"] for r in rows],
            "after speech_stopped": [r["audio"] - r["stopped"] for r in rows],
            "STT final": [r["final"] - r["stopped"] for r in rows],
            "model first delta": [r["delta"] - r["final"] for r in rows],
            "model (to first segment)": [r["segment"] - r["final"] for r in rows],
            "TTS (segment to audio)": [r["audio"] - r["segment"] for r in rows],
            "STT finish, engine alone": [a[0] for a in alone],
            "TTS first chunk, engine alone": [a[1] for a in alone],
            "gateway's own": [
                (r["final"] - r["finish_back"]) + (r["audio"] - r["chunk_back"]) for r in rows
            ],
            "turn detector (true end to stopped)": [r["stopped"] for r in rows],
        }
        return legs[name]

    print(
        f"{len(rows)} spoken turns ({rounds} rounds of {len(clips)} phrases), {mode},"
        f" {processes} speech worker(s), on {os.cpu_count()} CPUs"
    )
    for name in (
        "after true end",
        "turn detector (true end to stopped)",
        "after speech_stopped",
        "STT final",
        "model first delta",
        "model (to first segment)",
        "TTS (segment to audio)",
        "STT finish, engine alone",
        "TTS first chunk, engine alone",
        "gateway's own",
    ):
        values = column(name)
        print(
            f"  {name:38} p50 {statistics.median(values):6.0f} ms"
            f"   p90 {pct(values, 0.9):6.0f} ms   max {max(values):6.0f} ms"
        )
    print(
        f"  CPU: {cpu:.1f} s for {audio_ms / 1000:.1f} s of conversation audio"
        f" = {cpu / (audio_ms / 1000):.3f} CPU s per s (the gateway's process, which hosts the"
        " client too, and its speech workers)"
    )


if __name__ == "__main__":
    _rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    _mode = sys.argv[2] if len(sys.argv) > 2 else "server_vad"
    _processes = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    asyncio.run(main(_rounds, _mode, _processes))

"""What the offline speech engines (gateway/voice/offline.py) cost and how well they hear.

Over the demo's six phrases and two longer sentences (tests/voice_support.py), in this process,
one engine call at a time:

- **TTS** (piper, joe voice): each text synthesized at 24 kHz, the rate a session plays. First
  chunk = wall time from the call to the first PCM chunk (a sentence); RTF = wall time over
  the audio's duration; CPU = process CPU time (user + sys, all threads: onnxruntime's too)
  over the audio's duration.
- **STT** (pocketsphinx, primed as ``load_offline`` primes it): the text synthesized at 16 kHz
  is fed in 20 ms chunks as fast as they go in. Final = wall time of ``finish()`` after the
  last chunk (the end of the audio to the final text); CPU as above, feeding included; WER
  with numbers normalized (tests/voice_support.py), pooled over the phrases for the mean.
- **VAD** (Silero): the same 16 kHz audio in 32 ms frames; CPU per second of audio.
- **Resampler** (soxr HQ): 24 kHz to 16 kHz in 20 ms chunks, as a 24 kHz session feeds STT.

Piper samples noise, so each run's audio, and so its transcripts, differ a little. Prints
figures; asserts nothing (tests/test_voice_engines.py checks the accuracy with a margin).

    .venv/bin/python -m bench.voice_engines [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from gateway.voice.offline import PRIMING_TEXT, PiperTTS, PocketsphinxSTT, SileroVAD
from gateway.voice.resample import Resampler
from tests.voice_support import DEMO_PHRASES, LONG_PHRASES, chunks, word_errors

__all__: list[str] = []

T = TypeVar("T")
OUT_RATE = 24000
STT_RATE = 16000


def timed(action: Callable[[], T]) -> tuple[T, float, float]:
    """(what ``action`` returned, its wall seconds, its process CPU seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def first_chunk(tts: PiperTTS, text: str) -> tuple[float, float, float, float]:
    """(first chunk s, total wall s, CPU s, audio s) of ``text`` synthesized at 24 kHz."""
    wall, cpu = time.perf_counter(), time.process_time()
    first, size = 0.0, 0
    for chunk in tts.synthesize(text, OUT_RATE):
        first = first or time.perf_counter() - wall
        size += len(chunk)
    return first, time.perf_counter() - wall, time.process_time() - cpu, size / 2 / OUT_RATE


def transcribe(stt: PocketsphinxSTT, pcm: bytes) -> tuple[str, float, float]:
    """(final text, end of audio to final s, CPU s) of 16 kHz ``pcm`` in 20 ms chunks."""
    cpu = time.process_time()
    stream = stt.stream()
    for chunk in chunks(pcm, STT_RATE, 20):
        stream.feed(chunk)
    final, latency, _ = timed(stream.finish)
    return final.text, latency, time.process_time() - cpu


def vad_cpu(vad: SileroVAD, pcm: bytes) -> float:
    vad.reset()
    frames = chunks(pcm[: len(pcm) - len(pcm) % vad.frame_bytes], STT_RATE, 32)
    return timed(lambda: [vad.speech_probability(frame) for frame in frames])[2]


def resample_cpu(pcm: bytes) -> float:
    resampler = Resampler(OUT_RATE, STT_RATE)
    pieces = chunks(pcm, OUT_RATE, 20)
    return timed(lambda: [*map(resampler.feed, pieces), resampler.flush()])[2]


def main(argv: list[str]) -> None:
    rounds = int(argv[1]) if len(argv) > 1 else 1
    stt, stt_load, _ = timed(PocketsphinxSTT)
    tts, tts_load, _ = timed(PiperTTS)
    vad, vad_load, _ = timed(SileroVAD)
    prime = b"".join(tts.synthesize(PRIMING_TEXT, STT_RATE))
    _, prime_s, _ = timed(lambda: stt.prime(prime))
    print(
        f"load: pocketsphinx {stt_load:.2f} s, piper {tts_load:.2f} s, silero "
        f"{1000 * vad_load:.0f} ms, priming {prime_s:.2f} s; {rounds} round(s)"
    )
    print(
        f"{'text':<44} {'audio s':>7} {'WER':>5} {'final ms':>8} {'STT cpu/s':>9} "
        f"{'TTS 1st ms':>10} {'RTF':>5} {'TTS cpu/s':>9} {'VAD cpu/s':>9}"
    )
    errors = words = 0
    audio = stt_cpu = tts_cpu = tts_wall = vad_total = resample_total = audio24 = 0.0
    finals, firsts = [], []
    for _ in range(rounds):
        for text in DEMO_PHRASES + LONG_PHRASES:
            first, wall, cpu, seconds24 = first_chunk(tts, text)
            pcm24 = b"".join(tts.synthesize(text, OUT_RATE))
            pcm = b"".join(tts.synthesize(text, STT_RATE))
            seconds = len(pcm) / 2 / STT_RATE
            heard, latency, heard_cpu = transcribe(stt, pcm)
            vad_s = vad_cpu(vad, pcm)
            resample_total += resample_cpu(pcm24)
            e, n = word_errors(text, heard)
            errors, words = errors + e, words + n
            audio, audio24 = audio + seconds, audio24 + seconds24
            stt_cpu, tts_cpu, tts_wall, vad_total = (
                stt_cpu + heard_cpu,
                tts_cpu + cpu,
                tts_wall + wall,
                vad_total + vad_s,
            )
            finals.append(latency)
            firsts.append(first)
            label = text if len(text) <= 44 else text[:41] + "..."
            print(
                f"{label:<44} {seconds:7.2f} {e / n:5.0%} {1000 * latency:8.0f} "
                f"{heard_cpu / seconds:9.3f} {1000 * first:10.0f} {wall / seconds24:5.2f} "
                f"{cpu / seconds24:9.3f} {vad_s / seconds:9.4f}"
            )
            print(f"{'':<4}heard: {heard!r}")
    print(
        f"\nover {audio:.1f} s of speech: WER {errors / words:.1%} ({errors}/{words} words); "
        f"STT final {1000 * statistics.mean(finals):.0f} ms mean, {1000 * max(finals):.0f} max; "
        f"STT {stt_cpu / audio:.3f} CPU s per s"
    )
    print(
        f"TTS first chunk {1000 * statistics.median(firsts):.0f} ms median, "
        f"{1000 * max(firsts):.0f} max; RTF {tts_wall / audio24:.3f}; "
        f"{tts_cpu / audio24:.3f} CPU s per s"
    )
    print(
        f"VAD {vad_total / audio:.4f} CPU s per s; resampler 24->16 kHz "
        f"{1000 * resample_total / audio24:.2f} CPU ms per s"
    )


if __name__ == "__main__":
    main(sys.argv)

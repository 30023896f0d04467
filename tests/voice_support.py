"""Helpers for the speech engines' tests and bench: the demo's phrases, word error rate with
numbers normalized, and the speech edges of a synthesized clip.

WER as the engines' evaluation measured it (docs/voice.md): lowercase, no punctuation, common
contractions expanded (what's -> what is), and every number, written in digits or in words,
becomes one token per digit: "92031", "nine two oh three one" and "ninety two thousand thirty
one" all give ``9 2 0 3 1`` (pocketsphinx writes numbers as words).
"""

from __future__ import annotations

import asyncio
import re
import time
from array import array
from typing import Any

__all__ = [
    "DEMO_PHRASES",
    "LONG_PHRASES",
    "answer_as_the_demo_device",
    "chunks",
    "echo_of",
    "normalize",
    "rms",
    "say_in_real_time",
    "speech_edges_ms",
    "spoken",
    "transcribe",
    "word_errors",
]

DEMO_PHRASES = [
    "what's my battery level?",
    "open the settings",
    "nearest store to 92031",
    "do you have headphones in stock?",
    "where is my order 1234?",
    "hello",
]
LONG_PHRASES = [
    "I would like to change the delivery address for my last order to my office downtown.",
    "Can you tell me how long the battery lasts when I am streaming music all day?",
]

_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    " fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = {
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6}
_NUMBER_WORDS = set(_UNITS) | set(_TENS) | set(_SCALES) | {"oh", "and"}
_CONTRACTIONS = {
    "what's": "what is",
    "where's": "where is",
    "i'm": "i am",
    "it's": "it is",
    "that's": "that is",
    "don't": "do not",
    "can't": "cannot",
    "i'd": "i would",
    "i've": "i have",
}


def _number(words: list[str]) -> str:
    """A run of number words as digits: single digits ("nine two oh") digit by digit,
    anything else compositionally ("ninety two thousand thirty one" -> 92031)."""
    words = [w for w in words if w != "and"]
    if all(w in _UNITS[:10] or w == "oh" for w in words):
        return "".join("0" if w == "oh" else str(_UNITS.index(w)) for w in words)
    total = current = 0
    for w in words:
        if w in _UNITS:
            current += _UNITS.index(w)
        elif w in _TENS:
            current += _TENS[w]
        elif w == "hundred":
            current = max(current, 1) * 100
        elif w in _SCALES:
            total += max(current, 1) * _SCALES[w]
            current = 0
    return str(total + current)


def normalize(text: str) -> list[str]:
    """The words of ``text`` as WER counts them (module docstring)."""
    text = text.lower().replace("-", " ").replace("\u2019", "'")
    for short, long in _CONTRACTIONS.items():
        text = re.sub(rf"\b{short}\b", long, text)
    words = [w.strip("'") for w in re.sub(r"[^a-z0-9' ]+", " ", text).split() if w.strip("'")]
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        # "and" at the edges of a run is a word, not part of the number
        while run and run[0] == "and":
            out.append(run.pop(0))
        trailing = 0
        while run and run[-1] == "and":
            run.pop()
            trailing += 1
        if run:
            out.extend(_number(run))
        out.extend(["and"] * trailing)
        run.clear()

    for w in words:
        if w in _NUMBER_WORDS:
            run.append(w)
        else:
            flush()
            out.extend(w if w.isdigit() else [w])
    flush()
    return out


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits from ``reference`` to ``hypothesis``, words in ``reference``)."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    row = list(range(len(hyp) + 1))
    for i in range(1, len(ref) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(hyp) + 1):
            diagonal, row[j] = (
                row[j],
                min(row[j] + 1, row[j - 1] + 1, diagonal + (ref[i - 1] != hyp[j - 1])),
            )
    return row[len(hyp)], len(ref)


def chunks(pcm: bytes, rate: int, ms: int) -> list[bytes]:
    """``pcm`` (PCM16 at ``rate``) in chunks of ``ms``, the last one shorter."""
    step = rate * ms // 1000 * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


def rms(pcm: bytes) -> float:
    """The root mean square of PCM16 samples (0 for no samples)."""
    samples = array("h", pcm)
    return (sum(s * s for s in samples) / len(samples)) ** 0.5 if samples else 0.0


def speech_edges_ms(pcm: bytes, sample_rate: int, frame_ms: int = 10) -> tuple[int, int]:
    """Where the speech in clean ``pcm`` starts and ends, in ms: the first and last
    ``frame_ms`` frames whose RMS is within 40 dB of the loudest frame's."""
    step = sample_rate * frame_ms // 1000 * 2
    levels = [rms(pcm[i : i + step]) for i in range(0, len(pcm), step)]
    loud = [n for n, level in enumerate(levels) if level >= max(levels) / 100]
    return loud[0] * frame_ms, (loud[-1] + 1) * frame_ms


def echo_of(pcm: bytes, rate: int, *, delay_ms: int, scale: float = 0.3, seed: int = 7) -> bytes:
    """``pcm`` (PCM16 at ``rate``) as the microphone hears it played back: resampled to
    16 kHz, at ``scale`` of its level, ``delay_ms`` late, then 300 ms more, with white noise
    40 dB under it throughout (numpy, soxr: the ``voice`` extra)."""
    import numpy as np

    from gateway.voice.resample import Resampler

    resampler = Resampler(rate, 16000)
    played = scale * np.frombuffer(resampler.feed(pcm) + resampler.flush(), dtype="<i2")
    delay, tail = 16 * delay_ms, 16 * 300
    signal = np.concatenate([np.zeros(delay), played, np.zeros(tail)])
    level = float(np.sqrt(np.mean(played * played)))
    signal += np.random.default_rng(seed).normal(0, level / 100, signal.size)
    return bytes(np.clip(np.round(signal), -32768, 32767).astype("<i2").tobytes())


def spoken(tts: Any, text: str, rate: int = 16000) -> bytes:
    """``text`` as the user says it (``tts``: a ``PiperTTS``), PCM16 at ``rate``: 600 ms of
    silence, the words, 1 s of silence."""
    silence = b"\0\0" * rate
    return silence[: rate * 6 // 10] + b"".join(tts.synthesize(text, rate)) + silence


def transcribe(stt: Any, pcm: bytes, rate: int) -> str:
    """What ``stt`` (a ``PocketsphinxSTT``) hears in ``pcm`` (PCM16 at ``rate``)."""
    from gateway.voice.resample import Resampler

    resampler = Resampler(rate, stt.sample_rate)
    stream = stt.stream()
    stream.feed(resampler.feed(pcm) + resampler.flush())
    return str(stream.finish().text)


def answer_as_the_demo_device(conv: Any) -> None:
    """Register the demo agent's client functions on ``conv`` (a ``Conversation``), as a
    phone would answer them: what a spoken demo phrase may call."""

    @conv.client_function("get_battery_level")
    async def battery() -> dict[str, Any]:
        return {"level": 0.82, "charging": False}

    @conv.client_function("open_settings")
    async def settings(section: str = "general") -> dict[str, Any]:
        return {"opened": True}  # the demo's output_schema: a boolean

    @conv.client_function("get_nearest_store")
    async def store(zip_code: str) -> dict[str, Any]:
        return {"name": "Main St", "distance_km": 1.2}


async def say_in_real_time(conv: Any, pcm: bytes, rate: int = 16000, ms: int = 20) -> float:
    """Send ``pcm`` through ``conv.send_audio`` in ``ms`` frames at a microphone's pace (frame
    n + 1 is due (n + 1) * ``ms`` after the first); the ``perf_counter`` time it began."""
    start = time.perf_counter()
    for n, chunk in enumerate(chunks(pcm, rate, ms)):
        await conv.send_audio(chunk)
        await asyncio.sleep(max(0.0, start + (n + 1) * ms / 1000 - time.perf_counter()))
    return start

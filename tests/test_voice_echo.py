"""The echo gate (gateway/voice/echo.py) on real synthesized speech.

Piper speaks an answer at 24 kHz: the gate gets it as its reference, in 100 ms chunks and all
at once (the server sends faster than real time). The "microphone" hears that answer resampled
to 16 kHz, at 0.3 of its level, 900 ms late, with noise 40 dB under it; the user is another
phrase. Every window is 256 ms, one per 32 ms VAD frame, as the speech worker asks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from gateway.voice.echo import MAX_REFERENCE_S, EchoGate
from gateway.voice.resample import Resampler
from tests.voice_support import LONG_PHRASES, chunks

pytest.importorskip("piper")

from gateway.voice.offline import PiperTTS

RATE = 16000
WINDOW = RATE * 256 // 1000
FRAME = 512
DELAY = RATE * 900 // 1000
ANSWER, USER = LONG_PHRASES

Signal = npt.NDArray[np.float64]


@pytest.fixture(scope="module")
def answer() -> bytes:
    """The answer, PCM16 at 24 kHz, as the device plays it."""
    return b"".join(PiperTTS().synthesize(ANSWER, 24000))


@pytest.fixture(scope="module")
def user() -> Signal:
    """The user's phrase at 16 kHz, as samples."""
    return samples(b"".join(PiperTTS().synthesize(USER, RATE)))


@pytest.fixture(scope="module")
def echo(answer: bytes) -> Signal:
    """The answer coming back to the microphone: 16 kHz, 0.3 of its level, 900 ms late, with
    noise 40 dB under it, and 500 ms of that noise after it."""
    resampler = Resampler(24000, RATE)
    played = 0.3 * samples(resampler.feed(answer) + resampler.flush())
    signal = np.concatenate([np.zeros(DELAY), played, np.zeros(RATE // 2)])
    noise = np.random.default_rng(7).normal(0, level(played) / 100, signal.size)
    return signal + noise


def samples(pcm: bytes) -> Signal:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def pcm16(signal: Signal) -> bytes:
    return np.clip(np.round(signal), -32768, 32767).astype("<i2").tobytes()


def level(signal: Signal) -> float:
    return float(np.sqrt(np.mean(signal * signal)))


def gate_playing(answer: bytes) -> EchoGate:
    gate = EchoGate(RATE)
    for chunk in chunks(answer, 24000, 100):
        gate.reference(chunk, 24000)
    return gate


def windows(start: int, stop: int) -> Iterator[int]:
    """The ends of the windows, one per VAD frame, from ``start`` to ``stop``."""
    return iter(range(start + WINDOW, stop + 1, FRAME))


def test_every_window_of_the_echo_is_echo(answer: bytes, echo: Signal) -> None:
    gate = gate_playing(answer)
    speech_end = echo.size - RATE // 2
    ends = list(windows(DELAY, speech_end))
    assert len(ends) > 100  # the answer is about 4.6 s
    # With ``end``: one full search, then tracking the lag.
    assert all(gate.is_echo(pcm16(echo[end - WINDOW : end]), end=end) for end in ends)
    # Without it, every call searches the whole reference: the same answers.
    searching = gate_playing(answer)
    assert all(searching.is_echo(pcm16(echo[end - WINDOW : end])) for end in ends[::10])
    # Dropped (a new answer, a flushed playback): nothing is echo any more.
    gate.reset()
    assert not gate.has_reference
    assert not any(gate.is_echo(pcm16(echo[end - WINDOW : end]), end=end) for end in ends)


def test_a_lag_that_changes_is_found_again(answer: bytes, echo: Signal) -> None:
    """The tracked lag fails (the playback stalled for 2 s): the full search finds the new."""
    gate = gate_playing(answer)
    stalled = np.concatenate([echo[: DELAY + RATE], np.zeros(2 * RATE), echo[DELAY + RATE :]])
    before = list(windows(DELAY, DELAY + RATE))
    after = list(windows(DELAY + 3 * RATE, stalled.size - RATE // 2))
    assert all(gate.is_echo(pcm16(stalled[e - WINDOW : e]), end=e) for e in before + after)


def test_the_user_speaking_is_not_echo(answer: bytes, user: Signal) -> None:
    gate = gate_playing(answer)
    ends = list(windows(0, user.size))
    assert not any(gate.is_echo(pcm16(user[end - WINDOW : end]), end=end) for end in ends)


def test_the_user_over_the_echo_is_not_echo_where_the_user_is_as_loud(
    answer: bytes, echo: Signal, user: Signal
) -> None:
    """NCC is about 1/sqrt(1 + user/echo energy), 0.77 at 0.7. Measured: where the user's
    window had at least 0.7 of the echo's energy, none of 65 windows was echo; 4 of 12 from
    0.5 to 0.7. Each synthesis differs (piper samples noise): the bound has some margin."""
    gate = gate_playing(answer)
    speech = echo.copy()
    span = min(user.size, echo.size - DELAY)
    mine = user[:span] * level(echo[DELAY:]) / level(user)  # the same level overall
    speech[DELAY : DELAY + span] += mine
    as_loud = louder = 0
    as_loud_echo = louder_echo = 0
    for end in windows(DELAY, DELAY + span):
        user_energy = float(np.sum(mine[end - DELAY - WINDOW : end - DELAY] ** 2))
        echo_energy = float(np.sum(echo[end - WINDOW : end] ** 2))
        is_echo = gate.is_echo(pcm16(speech[end - WINDOW : end]), end=end)
        if user_energy >= echo_energy:
            louder += 1
            louder_echo += is_echo
        elif user_energy >= 0.7 * echo_energy:
            as_loud += 1
            as_loud_echo += is_echo
    assert louder >= 20
    assert as_loud >= 5
    assert louder_echo == 0
    assert (louder_echo + as_loud_echo) <= 0.1 * (louder + as_loud)


def test_silence_and_no_reference_are_not_echo(answer: bytes, echo: Signal) -> None:
    gate = gate_playing(answer)
    quiet = np.random.default_rng(3).normal(0, 2.0, WINDOW)  # -84 dBFS
    assert not gate.is_echo(bytes(WINDOW * 2))
    assert not gate.is_echo(pcm16(quiet), end=WINDOW)
    assert not gate.is_echo(b"")
    without = EchoGate(RATE)
    assert not without.has_reference
    assert not without.is_echo(pcm16(echo[DELAY : DELAY + WINDOW]))
    with pytest.raises(ValueError, match="odd length"):
        gate.is_echo(b"\x01\x02\x03")


def test_the_reference_keeps_its_last_minute() -> None:
    """White noise as the reference: a window of its first second is forgotten, its last is
    echo, and the tracked lag is counted past the dropped audio."""
    noise = np.random.default_rng(11).normal(0, 3000, (MAX_REFERENCE_S + 2) * RATE)
    gate = EchoGate(RATE)
    for chunk in chunks(pcm16(noise), RATE, 1000):
        gate.reference(chunk, RATE)
    first, last = noise[:WINDOW], noise[-2 * WINDOW :]
    assert not gate.is_echo(pcm16(first))
    end = noise.size + RATE  # the input is a second behind the reference
    assert gate.is_echo(pcm16(last[:WINDOW] * 0.5), end=end - WINDOW)
    assert gate.is_echo(pcm16(last[WINDOW:] * 0.5), end=end)

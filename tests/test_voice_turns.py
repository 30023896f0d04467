"""The turn detector (gateway/voice/turns.py) on synthetic speech probabilities.

Frames are 20 ms at 16 kHz (320 samples), so every offset is a whole number of frames.
"""

from __future__ import annotations

import pytest

from gateway.voice.turns import SpeechStarted, SpeechStopped, TurnDetector, TurnEvent

FRAME_MS = 20


def frames(*runs: tuple[float, int]) -> list[float]:
    """(probability, ms) runs as one probability per 20 ms frame."""
    return [p for p, ms in runs for _ in range(ms // FRAME_MS)]


def events(
    probabilities: list[float], silence_ms: int = 500, min_speech_ms: int = 100
) -> list[tuple[TurnEvent, int]]:
    """Each event with the offset (ms) of the audio pushed when it came out."""
    detector = TurnDetector(16000, 320, silence_ms=silence_ms, min_speech_ms=min_speech_ms)
    out: list[tuple[TurnEvent, int]] = []
    for p in probabilities:
        out.extend((event, detector.offset_ms) for event in detector.push(p))
    return out


def test_one_turn_starts_at_its_first_speech_frame_and_stops_after_the_silence():
    found = events(frames((0.1, 300), (0.9, 1000), (0.1, 800)))
    assert found == [(SpeechStarted(300), 400), (SpeechStopped(1300), 1800)]


def test_the_start_is_emitted_once_min_speech_ms_of_speech_ran():
    found = events(frames((0.0, 100), (0.8, 500), (0.0, 600)), min_speech_ms=200)
    assert found[0] == (SpeechStarted(100), 300)


def test_a_blip_under_min_speech_ms_is_no_start():
    probabilities = frames((0.0, 200), (0.9, 60), (0.0, 400), (0.9, 40), (0.0, 800))
    assert events(probabilities, min_speech_ms=100) == []


def test_a_blip_then_real_speech_starts_at_the_real_speech():
    found = events(frames((0.9, 40), (0.0, 100), (0.9, 400), (0.0, 600)))
    assert [event for event, _ in found] == [SpeechStarted(140), SpeechStopped(540)]


def test_a_700_ms_pause_splits_the_turn_at_500_ms_of_silence():
    speech = frames((0.0, 200), (0.9, 800), (0.0, 700), (0.9, 600), (0.0, 1000))
    assert [event for event, _ in events(speech, silence_ms=500)] == [
        SpeechStarted(200),
        SpeechStopped(1000),
        SpeechStarted(1700),
        SpeechStopped(2300),
    ]


def test_a_700_ms_pause_does_not_split_the_turn_at_800_ms_of_silence():
    speech = frames((0.0, 200), (0.9, 800), (0.0, 700), (0.9, 600), (0.0, 1000))
    assert events(speech, silence_ms=800) == [
        (SpeechStarted(200), 300),
        (SpeechStopped(2300), 3100),
    ]


def test_short_dips_inside_speech_do_not_end_the_turn():
    speech = frames((0.9, 300), (0.2, 100), (0.9, 300), (0.4, 480), (0.9, 100), (0.0, 500))
    assert [event for event, _ in events(speech)] == [SpeechStarted(0), SpeechStopped(1280)]


def test_the_threshold_is_inclusive():
    assert [e for e, _ in events(frames((0.5, 200), (0.49, 500)))] == [
        SpeechStarted(0),
        SpeechStopped(200),
    ]


def test_speech_running_to_the_end_has_started_but_not_stopped():
    detector = TurnDetector(16000, 512)  # Silero's frames: 32 ms
    pushed = [event for p in frames((0.0, 100), (1.0, 2000)) for event in detector.push(p)]
    assert pushed == [SpeechStarted(160)]
    assert detector.speaking


def test_offsets_count_samples_at_24_khz():
    detector = TurnDetector(24000, 480)  # 20 ms frames
    pushed = [
        event for p in frames((0.0, 1000), (0.9, 1000), (0.0, 600)) for event in detector.push(p)
    ]
    assert pushed == [SpeechStarted(1000), SpeechStopped(2000)]
    assert detector.offset_ms == 2600


@pytest.mark.parametrize(
    "arguments",
    [(0, 320), (16000, 0), (16000, 320, -1), (16000, 320, 500, 0.5, -1)],
)
def test_bad_settings_are_refused(arguments: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="must"):
        TurnDetector(*arguments)

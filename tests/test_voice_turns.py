"""The turn detector (gateway/voice/turns.py) on synthetic speech probabilities.

Frames are 20 ms at 16 kHz (320 samples), so every offset is a whole number of frames.
"""

from __future__ import annotations

import pytest

from gateway.voice.turns import (
    SemanticEndOfTurn,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    TurnEvent,
)

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


def test_a_new_silence_applies_from_the_next_frame():
    detector = TurnDetector(16000, 320, silence_ms=500)
    pushed = [
        event for p in frames((0.0, 200), (0.9, 800), (0.0, 300)) for event in detector.push(p)
    ]
    assert pushed == [SpeechStarted(200)]  # 300 ms of silence: not yet 500
    detector.silence_ms = 200  # the silence already heard counts: the next frame ends it
    assert detector.silence_ms == 200
    assert detector.push(0.0) == [SpeechStopped(1000)]
    assert detector.offset_ms == 1320


def test_a_longer_silence_set_mid_pause_keeps_the_turn_going():
    detector = TurnDetector(16000, 320, silence_ms=500)
    found: list[tuple[TurnEvent, int]] = []
    for n, p in enumerate(frames((0.9, 400), (0.0, 700), (0.9, 400), (0.0, 1500))):
        if n == 25:  # 100 ms into the pause, the partial ends mid-sentence
            detector.silence_ms = 1200
        if n == 70:  # 300 ms into the second part, the partial looks complete
            detector.silence_ms = 250
        found.extend((event, detector.offset_ms) for event in detector.push(p))
    assert found == [(SpeechStarted(0), 100), (SpeechStopped(1500), 1760)]


def test_a_bad_silence_is_refused():
    detector = TurnDetector(16000, 320)
    with pytest.raises(ValueError, match="must"):
        detector.silence_ms = -1
    assert detector.silence_ms == 500


SHORT, LONG, PLAIN = 250, 1200, 500  # SemanticEndOfTurn() at its defaults


@pytest.mark.parametrize(
    ("text", "wait"),
    [
        # complete-looking: two words or more, not ending on a listed word
        ("what is my battery level", SHORT),
        ("open the settings", SHORT),
        ("nearest store to ninety two thousand thirty one", SHORT),
        ("where is my order one thousand two hundred thirty four", SHORT),
        ("I would like to change my order.", SHORT),
        ("Do you have headphones in stock?", SHORT),
        # incomplete-looking: by the category of the last word
        ("i would like to", LONG),  # preposition
        ("change the delivery address for", LONG),
        ("tell me about", LONG),
        ("i want the", LONG),  # article
        ("i need a", LONG),
        ("for my", LONG),  # possessive
        ("is that your", LONG),
        ("i want to go and", LONG),  # conjunction
        ("tell me if", LONG),
        ("the battery lasts when", LONG),
        ("where is", LONG),  # auxiliary or modal
        ("i would", LONG),
        ("can you", SHORT),  # "you" is not listed: a question can end on it
        ("i'm", LONG),
        ("the order um", LONG),  # filler
        ("my order uh", LONG),
        ("order number twenty", LONG),  # number in progress
        ("one thousand two hundred", LONG),
        ("and then i", LONG),  # the subject "i"
        ("THE ORDER FOR", LONG),  # case does not matter
        ("my address for,", LONG),  # nor does punctuation
        ("to [noise]", LONG),  # a noise marker is no word
        # one word: too little to judge, unless it is a listed one
        ("hello", PLAIN),
        ("yes", PLAIN),
        ("to", LONG),
        # no words
        ("", PLAIN),
        ("   ", PLAIN),
        ("[noise]", PLAIN),
        ("<sil> open the settings <sil>", SHORT),
    ],
)
def test_the_wait_depends_on_how_the_words_end(text: str, wait: int) -> None:
    assert SemanticEndOfTurn().wait_ms(text) == wait


def test_the_waits_are_configurable():
    semantic = SemanticEndOfTurn(silence_ms=400, short_ms=200, long_ms=900, min_words=3)
    assert semantic.wait_ms("") == 400
    assert semantic.wait_ms("open settings") == 400  # under min_words
    assert semantic.wait_ms("open the settings") == 200
    assert semantic.wait_ms("open the") == 900


def test_the_long_wait_defaults_to_twice_the_silence_and_at_least_1200_ms():
    assert SemanticEndOfTurn(silence_ms=500).long_ms == 1200
    assert SemanticEndOfTurn(silence_ms=800).long_ms == 1600


@pytest.mark.parametrize(
    "arguments",
    [{"silence_ms": -1}, {"short_ms": -1}, {"long_ms": -1}, {"min_words": 0}],
)
def test_bad_semantic_settings_are_refused(arguments: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must"):
        SemanticEndOfTurn(**arguments)

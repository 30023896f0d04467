"""When the user's turn ends: ``server_vad`` (a fixed silence) against ``semantic`` (a silence
that depends on the words heard so far, gateway/voice/turns.py ``SemanticEndOfTurn``).

Clips, synthesized by piper (the joe voice) at 16 kHz, each trimmed to its speech (the edges
``tests.voice_support.speech_edges_ms`` finds) and padded with 300 ms of digital silence before
and ``TAIL_MS`` after:

- **whole**: each of the demo's phrases and long phrases (tests/voice_support.py) as one clip.
- **split**: each long phrase cut at every word boundary after a word a sentence does not end
  on (``INCOMPLETE_ENDINGS``: "...address for | my last order...") but the first, the two
  parts synthesized apart and joined by a ``PAUSE_MS`` pause of digital silence.

Each clip goes through, frame by frame (512 samples, 32 ms), as a session would: Silero VAD's
probability into a ``TurnDetector``; in ``semantic`` mode, the same frame first into a
pocketsphinx stream (primed, as ``load_offline`` primes it), and each new partial transcript
sets the detector's ``silence_ms`` to ``SemanticEndOfTurn(500).wait_ms(partial)``. At each end
of turn, the stream is finished, a new one opened and the silence set back to 500 ms.

Measured in audio time (the detector's own clock, so independent of this machine's speed):

- **false cut-off**: an end of turn whose speech ended before the end of the clip's speech
  (minus 150 ms of slack for Silero's and the RMS edge's differences): in a split clip, a turn
  ended at the mid-sentence pause.
- **end delay**: from the true end of the speech (the RMS edge) to the frame at which the
  detector ended the turn that holds it: what the user waits before the gateway answers
  (pocketsphinx's final text then takes about 100 ms more, in either mode).

Also the process CPU per second of audio of each mode (semantic mode adds pocketsphinx's
partials; a session decodes them anyway for its transcript). Piper samples noise, so each run's
audio, and so the partials, differ a little. Prints figures; asserts nothing.

    .venv/bin/python -m bench.turn_detection [rounds]
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from typing import NamedTuple

from gateway.voice.offline import OfflineEngines, SileroVAD, load_offline
from gateway.voice.turns import INCOMPLETE_ENDINGS, SemanticEndOfTurn, SpeechStopped, TurnDetector
from tests.voice_support import DEMO_PHRASES, LONG_PHRASES, speech_edges_ms

__all__: list[str] = []

RATE = 16000
SILENCE_MS = 500
PAUSE_MS = 700
LEAD_MS = 300
TAIL_MS = 2000
SLACK_MS = 150
MODES = [("server_vad 500", 500, False), ("server_vad 800", 800, False), ("semantic", 500, True)]
"""(label, silence_ms, semantic?): ``server_vad`` at 800 ms shows what a longer fixed silence
costs to avoid the cut-offs."""


class Clip(NamedTuple):
    label: str
    kind: str  # "whole" or "split"
    pcm: bytes
    end_ms: int
    """Where the speech ends."""


class Outcome(NamedTuple):
    cut_offs: list[str]
    """The partial transcript in force at each false cut-off (semantic mode)."""
    delay_ms: int | None
    """End of speech to end of turn; None when no turn ended after the speech."""
    partial: str
    """The partial transcript in force at the end of the turn (semantic mode)."""


def silence(ms: int) -> bytes:
    return bytes(RATE * ms // 1000 * 2)


def speech(engines: OfflineEngines, text: str) -> bytes:
    """``text`` synthesized at 16 kHz, trimmed to its speech."""
    pcm = b"".join(engines.tts.synthesize(text, RATE))
    start, end = speech_edges_ms(pcm, RATE)
    return pcm[RATE * start // 1000 * 2 : RATE * end // 1000 * 2]


def clip(label: str, kind: str, *parts: bytes) -> Clip:
    """The parts joined by ``PAUSE_MS`` pauses, with the lead and tail silences."""
    body = silence(PAUSE_MS).join(parts)
    end_ms = LEAD_MS + len(body) * 1000 // 2 // RATE
    return Clip(label, kind, silence(LEAD_MS) + body + silence(TAIL_MS), end_ms)


def splits(phrase: str) -> list[tuple[str, str]]:
    """``phrase`` cut after each word (but the first) that a sentence does not end on."""
    words = phrase.split()
    return [
        (" ".join(words[:n]), " ".join(words[n:]))
        for n in range(2, len(words))
        if re.sub(r"[^a-z']", "", words[n - 1].lower()) in INCOMPLETE_ENDINGS
    ]


def clips(engines: OfflineEngines) -> list[Clip]:
    out = [clip(text, "whole", speech(engines, text)) for text in DEMO_PHRASES + LONG_PHRASES]
    for phrase in LONG_PHRASES:
        for first, rest in splits(phrase):
            label = f"{first} | {rest}"
            out.append(clip(label, "split", speech(engines, first), speech(engines, rest)))
    return out


def run(engines: OfflineEngines, item: Clip, silence_ms: int, semantic: bool) -> Outcome:
    """``item`` through Silero, the detector and (``semantic``) pocketsphinx's partials."""
    vad, words = SileroVAD(), SemanticEndOfTurn(silence_ms)
    detector = TurnDetector(RATE, vad.frame_samples, silence_ms=silence_ms)
    stream = engines.stt.stream()
    cut_offs: list[str] = []
    delay, partial, last = None, "", ""
    for at in range(0, len(item.pcm) - vad.frame_bytes + 1, vad.frame_bytes):
        frame = item.pcm[at : at + vad.frame_bytes]
        if semantic and (heard := stream.feed(frame)) is not None:
            last = heard.text
            detector.silence_ms = words.wait_ms(last)
        for event in detector.push(vad.speech_probability(frame)):
            if not isinstance(event, SpeechStopped):
                continue
            if event.offset_ms < item.end_ms - SLACK_MS:
                cut_offs.append(last)
            elif delay is None:
                delay, partial = detector.offset_ms - item.end_ms, last
            stream.finish()
            stream, last = engines.stt.stream(), ""
            detector.silence_ms = silence_ms
    stream.finish()
    return Outcome(cut_offs, delay, partial)


def main(argv: list[str]) -> None:
    rounds = int(argv[1]) if len(argv) > 1 else 1
    started = time.perf_counter()
    engines = load_offline()
    print(f"engines loaded in {time.perf_counter() - started:.1f} s; {rounds} round(s)")
    # per mode and kind: cut-offs, clips, delays; per mode: CPU s, audio s
    cut: dict[tuple[str, str], int] = {}
    count: dict[tuple[str, str], int] = {}
    delays: dict[tuple[str, str], list[int]] = {}
    cpu: dict[str, float] = {}
    audio = 0.0
    for _ in range(rounds):
        for item in clips(engines):
            audio += len(item.pcm) / 2 / RATE
            row = []
            for label, silence_ms, semantic in MODES:
                before = time.process_time()
                outcome = run(engines, item, silence_ms, semantic)
                cpu[label] = cpu.get(label, 0.0) + time.process_time() - before
                key = (label, item.kind)
                cut[key] = cut.get(key, 0) + len(outcome.cut_offs)
                count[key] = count.get(key, 0) + 1
                if outcome.delay_ms is not None:
                    delays.setdefault(key, []).append(outcome.delay_ms)
                shown = "-" if outcome.delay_ms is None else str(outcome.delay_ms)
                row.append(f"{len(outcome.cut_offs)}/{shown:>5}")
            name = item.label if len(item.label) <= 58 else item.label[:55] + "..."
            print(f"{item.kind:<5} {name:<58} " + " ".join(f"{cell:>9}" for cell in row))
            # the last mode is semantic: what it had heard when it cut off, or at the end
            for heard in outcome.cut_offs:
                print(f"{'':<6}semantic cut off at: {heard!r}")
            print(f"{'':<6}semantic ended at: {outcome.partial!r}")
    print(f"\n(cells: cut-offs/end delay ms, modes: {', '.join(m[0] for m in MODES)})")
    print(f"{'mode':<15} {'clips':<6} {'cut-offs':>9} {'delay mean':>10} {'p50':>5} {'max':>5}")
    for label, _, _ in MODES:
        for kind in ("whole", "split"):
            key = (label, kind)
            found = delays.get(key, [])
            figures = (
                f"{statistics.mean(found):10.0f} {statistics.median(found):5.0f} {max(found):5d}"
                if found
                else f"{'-':>10} {'-':>5} {'-':>5}"
            )
            print(f"{label:<15} {kind:<6} {cut[key]:>4}/{count[key]:<4} {figures}")
        print(f"{'':<15} CPU {cpu[label] / audio:.3f} s per s of audio")


if __name__ == "__main__":
    main(sys.argv)

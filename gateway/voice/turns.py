"""Where the user's turn starts and stops, from a voice activity detector's probabilities.

Pure: no engine, no I/O, no clock. Time is the audio itself: the detector counts the samples
of the frames it was given, so the same probabilities always give the same events, however
fast or late the audio arrives.

The rule (``server_vad``):

- A turn **starts** at the first frame of a run of speech frames (probability at or above
  ``threshold``) that lasts ``min_speech_ms``. A shorter blip (a click, a cough) is not a
  start. ``SpeechStarted`` is emitted when the run has lasted that long, with the offset of the
  run's first frame.
- It **stops** at the end of its last speech frame, once ``silence_ms`` of non-speech frames
  followed. ``SpeechStopped`` is emitted then (so ``silence_ms`` after its offset) and a pause
  shorter than ``silence_ms`` does not end the turn: at the default 500 ms, a 700 ms pause
  mid-sentence splits the turn in two; at 800 ms it does not.

Offsets are whole milliseconds of audio since the detector began.

``silence_ms`` can change while the audio runs (``TurnDetector.silence_ms`` is settable): the
``semantic`` mode sets it, as the recognizer's partial transcript changes, to the wait that
``SemanticEndOfTurn`` gives for the words heard so far: short when they look like a complete
sentence, long when they stop mid-sentence ("I would like to ... [pause] ... change my order").
"""

from __future__ import annotations

import re

import msgspec

__all__ = [
    "INCOMPLETE_ENDINGS",
    "SemanticEndOfTurn",
    "SpeechStarted",
    "SpeechStopped",
    "TurnDetector",
    "TurnEvent",
]


class SpeechStarted(msgspec.Struct, frozen=True):
    """The user started speaking ``offset_ms`` into the audio."""

    offset_ms: int


class SpeechStopped(msgspec.Struct, frozen=True):
    """The user stopped speaking ``offset_ms`` into the audio: the end of the turn."""

    offset_ms: int


TurnEvent = SpeechStarted | SpeechStopped


class TurnDetector:
    """Turns a stream of per-frame speech probabilities into turn starts and stops.

    ``frame_samples`` is the size of each frame the probabilities are for (512 for Silero at
    16 kHz: 32 ms); ``sample_rate`` converts samples to milliseconds.
    """

    def __init__(
        self,
        sample_rate: int,
        frame_samples: int,
        silence_ms: int = 500,
        threshold: float = 0.5,
        min_speech_ms: int = 100,
    ) -> None:
        if sample_rate <= 0 or frame_samples <= 0:
            raise ValueError("sample_rate and frame_samples must be positive")
        if silence_ms < 0 or min_speech_ms < 0:
            raise ValueError("silence_ms and min_speech_ms must not be negative")
        self.sample_rate = sample_rate
        self.frame_samples = frame_samples
        self.threshold = threshold
        # Durations in samples, rounded up: the detector compares whole frames' samples.
        self._silence_ms = silence_ms
        self._silence = self._samples(silence_ms)
        self._min_speech = self._samples(min_speech_ms)
        self._position = 0
        """Samples seen so far: the end of the last frame pushed."""
        self._run_start: int | None = None
        """Where the current run of speech frames began, while it is not yet a turn."""
        self._speaking = False
        self._speech_end = 0
        """The end of the last speech frame of the turn in progress."""

    @property
    def speaking(self) -> bool:
        """Whether a turn has started and not yet stopped."""
        return self._speaking

    @property
    def silence_ms(self) -> int:
        """The silence that ends a turn. Settable at any time; the new value applies from the
        next frame pushed, and counts the silence already heard: set lower than the silence
        that already followed the last speech frame, the next non-speech frame ends the turn
        (its ``SpeechStopped`` still has the offset of the end of the speech)."""
        return self._silence_ms

    @silence_ms.setter
    def silence_ms(self, value: int) -> None:
        if value < 0:
            raise ValueError("silence_ms must not be negative")
        self._silence_ms, self._silence = value, self._samples(value)

    @property
    def offset_ms(self) -> int:
        """Milliseconds of audio seen so far."""
        return self._ms(self._position)

    def push(self, probability: float) -> list[TurnEvent]:
        """Take the next frame's speech probability; return the events it completes (none,
        or one: a start or a stop)."""
        start, self._position = self._position, self._position + self.frame_samples
        speech = probability >= self.threshold
        if self._speaking:
            if speech:
                self._speech_end = self._position
            elif self._position - self._speech_end >= self._silence:
                self._speaking = False
                return [SpeechStopped(self._ms(self._speech_end))]
            return []
        if not speech:
            self._run_start = None  # a blip shorter than min_speech_ms
            return []
        if self._run_start is None:
            self._run_start = start
        if self._position - self._run_start < self._min_speech:
            return []
        self._speaking, self._speech_end = True, self._position
        run_start, self._run_start = self._run_start, None
        return [SpeechStarted(self._ms(run_start))]

    def _ms(self, samples: int) -> int:
        return samples * 1000 // self.sample_rate

    def _samples(self, ms: int) -> int:
        return -(-ms * self.sample_rate // 1000)  # rounded up


# The words after which an English sentence is not over: a partial transcript ending in one
# of them means the user paused mid-sentence. Lowercase, as pocketsphinx writes them.
CONJUNCTIONS = frozenset(
    "and or but nor so because if than when while although though unless until whether"
    " since as whereas".split()
)
ARTICLES = frozenset("a an the every each another".split())
PREPOSITIONS = frozenset(
    "to for of in on at by with from about into onto over under after before between"
    " through during without within near towards toward via per".split()
)
POSSESSIVES = frozenset("my your our their its whose".split())
AUXILIARIES = frozenset(
    "is are was were am be been being do does did have has had can could will would shall"
    " should may might must i'm you're we're they're it's that's what's where's there's"
    " i'd you'd i'll you'll we'll i've you've we've don't doesn't didn't can't won't"
    " isn't aren't wasn't".split()
)
FILLERS = frozenset("um uh uhm erm er ah hmm mm".split())
NUMBERS_IN_PROGRESS = frozenset(
    "twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million point".split()
)
INCOMPLETE_ENDINGS = (
    CONJUNCTIONS
    | ARTICLES
    | PREPOSITIONS
    | POSSESSIVES
    | AUXILIARIES
    | FILLERS
    | NUMBERS_IN_PROGRESS
    | {"i"}
)
"""Every word that, last in a partial transcript, makes it look unfinished."""

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_MARKER = re.compile(r"\[[^\]]*\]|<[^>]*>")
"""A recognizer's non-word marker: "[noise]", "<sil>"."""


class SemanticEndOfTurn:
    """How long a silence ends the user's turn, from the words heard so far.

    Pure: text in, milliseconds out. The rule, on the latest partial transcript (lowercased;
    words are runs of letters with an optional apostrophe part; punctuation and markers such
    as "[noise]" or "<sil>" do not count):

    - **no words**: ``silence_ms``, the plain ``server_vad`` wait.
    - **incomplete**: the last word is one a sentence does not end on (``INCOMPLETE_ENDINGS``):
      a conjunction (and, or, but, so, because, if, when, ...), an article (a, an, the,
      every, ...), a preposition (to, for, of, in, on, at, with, from, about, near, ...), a
      possessive (my, your, our, their, its), an auxiliary or modal, contracted or not (is,
      are, do, have, can, would, i'm, don't, ...), a filler (um, uh, er, hmm, ...), a number
      in progress (twenty to ninety, hundred, thousand, million, point) or the subject "i":
      ``long_ms`` (default ``max(2 * silence_ms, 1200)``), since the user is likely to go on.
    - **complete**: ``min_words`` words or more (default 2) and the last word is none of
      those: ``short_ms`` (default 250), so the turn ends sooner than ``server_vad`` would.
    - a single word that is none of those ("hello", "yes"): ``silence_ms``. One word is too
      little to judge, and pocketsphinx's first partial is often a misheard first syllable.

    The lists are deliberately small and leave out words that often end a sentence too
    ("up", "out", "that", "this", "her", "like"): a word wrongly taken as incomplete only
    makes the user wait ``long_ms``, but a word wrongly taken as complete can cut them off
    after ``short_ms``. Some complete sentences still end on a listed word ("turn it on",
    "yes I do"): they wait ``long_ms``.
    """

    def __init__(
        self,
        silence_ms: int = 500,
        short_ms: int = 250,
        long_ms: int | None = None,
        min_words: int = 2,
    ) -> None:
        if long_ms is None:
            long_ms = max(2 * silence_ms, 1200)
        if min(silence_ms, short_ms, long_ms) < 0:
            raise ValueError("silence_ms, short_ms and long_ms must not be negative")
        if min_words < 1:
            raise ValueError("min_words must be at least 1")
        self.silence_ms = silence_ms
        self.short_ms = short_ms
        self.long_ms = long_ms
        self.min_words = min_words

    def wait_ms(self, text: str) -> int:
        """The silence, in ms, that ends the turn after the words of ``text``."""
        words = _WORD.findall(_MARKER.sub(" ", text.lower().replace("\u2019", "'")))
        if not words:
            return self.silence_ms
        if words[-1] in INCOMPLETE_ENDINGS:
            return self.long_ms
        return self.short_ms if len(words) >= self.min_words else self.silence_ms

"""The user's audio: frames from the socket, turns and transcripts into the session.

The ``Listener`` takes a session's input audio (PCM16 at its ``input_rate``) in order, and
runs it through one transcription stream on a speech worker (``VoiceWorkers``): the voice
activity detector hears all of it, the recognizer only the user's turns, each from a little
before its first word (``PREROLL_MS``). It tells the session, as events:

- ``SpeechStarted`` / ``SpeechStopped`` where ``TurnDetector`` puts them (``server_vad``:
  after ``silence_ms`` of silence; ``semantic``: that wait set from the words heard so far,
  ``SemanticEndOfTurn``); in ``manual`` mode no detector runs, and ``input_audio.commit``
  ends the turn;
- ``Transcribed``: partials while the user speaks, the final one at the end of the turn;
- a barge-in: speech that starts while an answer plays (or runs) must last
  ``interrupt_min_ms`` before it counts (a cough does not cut the answer), and frames the
  echo gate finds to be the answer's own audio coming back through the microphone
  (``reference``) are not speech at all.

Bounded: a turn lasts at most ``MAX_TURN_MS`` (then it ends as if the user stopped), at most
``MAX_QUEUED`` frames wait for the worker (the socket's reader waits meanwhile), and a
client may send audio at most ``AUDIO_RATE`` times as fast as real time beyond a burst of
``AUDIO_BURST_MS`` (it is slowed, not refused).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

import structlog

from gateway.core.audio import AudioSettings
from gateway.core.event import Event, SpeechStarted, SpeechStopped, Transcribed, VoiceFailed
from gateway.core.inbound import DecodeFailure
from gateway.voice.resample import Resampler
from gateway.voice.turns import SemanticEndOfTurn, TurnDetector
from gateway.voice.turns import SpeechStarted as TurnStarted
from gateway.voice.workers import Heard, SpeechEngineError, Transcription, VoiceWorkers

__all__ = ["AUDIO_BURST_MS", "AUDIO_RATE", "MAX_FRAME_MS", "MAX_TURN_MS", "Listener"]

log = structlog.get_logger("gateway.voice")

STT_RATE = 16000
"""The rate the recognizer and the detector take."""
MAX_FRAME_MS = 250
"""The most audio one client frame may carry."""
MAX_TURN_MS = 60_000
"""The longest turn: the recognizer's buffer, per session."""
MAX_QUEUED = 64
"""Frames waiting for the worker, per session, before the socket's reader waits."""
AUDIO_RATE = 2.0
"""How much faster than real time a client may send audio, sustained."""
AUDIO_BURST_MS = 10_000
"""Audio a client may send at once beyond that rate (a recording, say)."""
PREROLL_MS = 500
"""Audio before the detected start of speech the recognizer hears too (its first sounds)."""
MIN_SPEECH_MS = 100
"""Speech shorter than this is not the start of a turn (the detector's rule)."""

_Control = Literal["commit", "clear"]


class Listener:
    """Listens to one session's audio under ``audio``; see the module docstring.

    Args:
        audio: the session's audio settings.
        workers: the node's speech workers (started when first needed).
        feed: gives the session an event.
        answer_playing: how much of the answer playing now has played, in ms; ``None``
            when none plays nor runs (the speaker's, and the session's response).
        clock: loop time, in seconds.
    """

    def __init__(
        self,
        audio: AudioSettings,
        *,
        workers: Callable[[], Awaitable[VoiceWorkers]],
        feed: Callable[[Event], None],
        answer_playing: Callable[[], int | None],
        clock: Callable[[], float],
    ) -> None:
        self.audio = audio
        self._workers = workers
        self._feed = feed
        self._answer_playing = answer_playing
        self._clock = clock
        self._manual = audio.turn_detection == "manual"
        self._semantic = (
            SemanticEndOfTurn(audio.silence_ms) if audio.turn_detection == "semantic" else None
        )
        self._resampler = Resampler(audio.input_rate, STT_RATE)
        self._queue: asyncio.Queue[bytes | _Control | tuple[bytes, int]] = asyncio.Queue()
        self._room = asyncio.Semaphore(MAX_QUEUED)
        """Taken by each client frame while it waits for the worker."""
        self._tokens = float(AUDIO_BURST_MS)
        self._tokens_at = clock()
        self._stream: Transcription | None = None
        self._detector: TurnDetector | None = None
        self._preroll: deque[bytes] = deque()
        self._heard = 0
        """Samples (at ``STT_RATE``) heard so far: the offset of the audio coming next."""
        self._turn_start: int | None = None
        """Where the turn in progress began, in samples; ``None`` between turns."""
        self._pending: int | None = None
        """Speech over an answer not yet long enough to cut it: the ms of it so far."""
        self._reported = False
        """The turn in progress was told to the session (``SpeechStarted``)."""
        self._closed = False
        self._task = asyncio.create_task(self._run(), name="gateway:listener")

    # ----------------------------------------------------------------- input

    def check(self, pcm: bytes) -> DecodeFailure | None:
        """Why a client frame is refused (the error the client gets), or ``None``."""
        if not pcm or len(pcm) % 2:
            return DecodeFailure(
                code="invalid_audio",
                message=f"audio must be PCM16: whole 2-byte samples, got {len(pcm)} bytes",
            )
        ms = len(pcm) * 1000 // (2 * self.audio.input_rate)
        if ms > MAX_FRAME_MS:
            return DecodeFailure(
                code="message_too_large",
                message=f"an audio frame holds at most {MAX_FRAME_MS} ms: this one has {ms} ms"
                f" at {self.audio.input_rate} Hz",
            )
        return None

    async def hear(self, pcm: bytes) -> None:
        """Take a client frame (checked already), once there is room, at no more than
        ``AUDIO_RATE`` times real time beyond the burst."""
        ms = len(pcm) * 1000 / (2 * self.audio.input_rate)
        now = self._clock()
        self._tokens = min(
            AUDIO_BURST_MS, self._tokens + (now - self._tokens_at) * 1000 * AUDIO_RATE
        )
        self._tokens_at = now
        if self._tokens < ms:
            await asyncio.sleep((ms - self._tokens) / (1000 * AUDIO_RATE))
        self._tokens -= ms
        await self._room.acquire()
        if not self._closed:  # closed while this waited: the audio goes nowhere
            self._queue.put_nowait(pcm)

    def control(self, what: _Control) -> None:
        """``input_audio.commit`` or ``input_audio.clear``, after the audio sent before it
        (not bounded by ``MAX_QUEUED``: one per message, which the socket's rate bounds)."""
        self._queue.put_nowait(what)

    def reference(self, pcm: bytes, rate: int) -> None:
        """The answer's audio the device plays, for the echo gate (bounded by the answer:
        the speaker's frames)."""
        if not self._manual:
            self._queue.put_nowait((pcm, rate))

    # ----------------------------------------------------------------- the work

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                if isinstance(item, bytes):
                    self._room.release()
                    await self._audio(self._resampler.feed(item))
                elif isinstance(item, tuple):
                    if self._stream is not None:
                        await self._stream.reference(*item)
                elif item == "commit":
                    await self._commit()
                else:
                    await self._clear()
            except SpeechEngineError as exc:
                log.warning("speech_recognition_failed", error=str(exc))
                self._feed(VoiceFailed(f"the user's speech could not be heard: {exc}"))
                await self._drop_stream()
            except Exception:  # our bug: this turn is lost, the next one is heard
                log.exception("listener_failed")
                self._feed(VoiceFailed("the user's speech could not be heard"))
                await self._drop_stream()

    async def _open(self) -> Transcription:
        if self._stream is None:
            workers = await self._workers()
            self._stream = await workers.open_transcription(vad=not self._manual)
            if not self._manual:
                self._detector = TurnDetector(
                    STT_RATE, self._stream.frame_samples, silence_ms=self.audio.silence_ms
                )
        return self._stream

    async def _audio(self, pcm: bytes) -> None:
        stream = await self._open()
        start, self._heard = self._heard, self._heard + len(pcm) // 2
        if self._manual:
            if self._turn_start is None:
                self._turn_start = start
            self._partial(await stream.hear(pcm, vad=False, stt=True))
        else:
            self._preroll.append(pcm)
            while sum(map(len, self._preroll)) > PREROLL_MS * STT_RATE * 2 // 1000:
                self._preroll.popleft()
            heard = await stream.hear(pcm, vad=True, stt=self._turn_start is not None)
            self._partial(heard)
            echo = heard.echo or [False] * len(heard.probabilities)
            for probability, is_echo in zip(heard.probabilities, echo, strict=True):
                await self._frame(stream, 0.0 if is_echo else probability)
        if self._turn_start is not None and self._heard - self._turn_start >= _samples(MAX_TURN_MS):
            await self._end_turn()

    def _partial(self, heard: Heard) -> None:
        transcript = heard.transcript
        if transcript is None or not transcript.text or not (self._reported or self._manual):
            return
        self._feed(Transcribed(transcript.text, final=False))
        if self._semantic is not None and self._detector is not None:
            self._detector.silence_ms = self._semantic.wait_ms(transcript.text)

    async def _frame(self, stream: Transcription, probability: float) -> None:
        """One VAD frame's probability (0 for an echo)."""
        detector = self._detector
        assert detector is not None
        if self._pending is not None and probability >= detector.threshold:
            self._pending += detector.frame_samples * 1000 // STT_RATE
            if self._pending >= self.audio.interrupt_min_ms:
                self._report_start(interrupting=True)
        for event in detector.push(probability):
            if isinstance(event, TurnStarted):
                self._turn_start = _samples(event.offset_ms)
                # The recognizer hears the turn from a little before its first word.
                await stream.hear(b"".join(self._preroll), vad=False, stt=True)
                self._preroll.clear()
                if self._answer_playing() is None:
                    self._report_start(interrupting=False)
                elif self.audio.interrupt_min_ms <= MIN_SPEECH_MS:
                    self._report_start(interrupting=True)
                else:
                    self._pending = MIN_SPEECH_MS
            elif self._turn_start is not None:
                await self._end_turn(event.offset_ms)

    def _report_start(self, *, interrupting: bool) -> None:
        assert self._turn_start is not None
        self._pending, self._reported = None, True
        played = self._answer_playing()
        self._feed(
            SpeechStarted(
                _ms(self._turn_start),
                interrupting=interrupting and played is not None,
                played_ms=played or 0,
            )
        )

    async def _end_turn(self, offset_ms: int | None = None) -> None:
        """The turn ends: told to the session with its transcript, unless it was never
        told (speech over an answer too short to count: dropped)."""
        stream = self._stream
        assert stream is not None
        reported, self._reported, self._pending = self._reported, False, None
        self._turn_start = None
        if self._detector is not None:  # semantic mode set it from the words heard
            self._detector.silence_ms = self.audio.silence_ms
        final = await stream.finish(keep=True)
        if reported or self._manual:
            if not self._manual:
                self._feed(SpeechStopped(_ms(self._heard) if offset_ms is None else offset_ms))
            self._feed(Transcribed(final.text, final=True))

    async def _commit(self) -> None:
        if self._turn_start is None:
            self._feed(
                DecodeFailure(
                    code="invalid_audio",
                    message="input_audio.commit: no audio of a turn to commit",
                )
            )
            return
        if not self._reported and not self._manual:
            self._report_start(interrupting=self._answer_playing() is not None)
        await self._end_turn()

    async def _clear(self) -> None:
        if self._turn_start is not None and self._stream is not None:
            await self._stream.finish(keep=True)  # its words are dropped
        self._turn_start, self._pending, self._reported = None, None, False
        self._preroll.clear()
        # A turn the detector is in goes on there; its end is not told (no turn now).

    async def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        self._turn_start, self._pending, self._reported = None, None, False
        if stream is not None:
            await stream.aclose()

    async def aclose(self) -> None:
        """Stop listening; a socket's reader waiting for room (``hear``) goes on at once."""
        self._closed = True
        for _ in range(MAX_QUEUED):
            self._room.release()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(Exception):
            await self._drop_stream()


def _samples(ms: int) -> int:
    return ms * STT_RATE // 1000


def _ms(samples: int) -> int:
    return samples * 1000 // STT_RATE

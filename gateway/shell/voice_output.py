"""The answer's audio: the segments a session asks to speak, synthesized and sent as frames.

The core asks for each segment of a spoken answer (``Speak``, in order), says when an
answer has no more (``EndSpeech``), and stops one at a barge-in (``StopSpeaking``). The
``Speaker`` synthesizes the segments one after another on the speech workers, cuts the
audio into frames of at most ``FRAME_MS`` with the header of ``gateway.wire.audio_frame``
(the last of each segment flagged ``LAST``), and writes them to the session's socket, if
one is attached (audio is not logged: a client that was away gets it from the moment it is
back). It reports what it spoke to the core:
``SegmentSpoken`` after each segment, ``SpeechDone`` once an answer's audio is all sent
(so every frame is on the socket before ``audio.done``) or stopped.

It also knows, roughly, what the user's device is playing: the device plays an answer's
frames from the moment the first one is sent, without a gap (``played_ms``), which the
listener needs to tell a barge-in from silence, and to which answer's audio an echo
belongs (``on_audio`` gets every frame).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

import structlog

from gateway.core.event import (
    EndSpeech,
    Event,
    SegmentSpoken,
    Speak,
    SpeechDone,
    StopSpeaking,
    VoiceFailed,
)
from gateway.shell.connection import BinaryFrame, Connection
from gateway.voice.workers import VoiceWorkers
from gateway.wire.audio_frame import encode_answer_audio

__all__ = ["FRAME_MS", "Speaker"]

log = structlog.get_logger("gateway.voice")

FRAME_MS = 100
"""The most audio one binary frame carries."""
PLAYBACK_SLACK = 0.3
"""Seconds a device may lag behind the frames sent to it (its buffer, the network)."""


class Speaker:
    """Speaks one session's answers; see the module docstring.

    Args:
        rate: the session's ``output_rate``.
        voice: the session's voice (changed from the next segment on).
        workers: the node's speech workers (started when first needed).
        conn: the session's socket now, if one is attached.
        feed: gives the session an event.
        clock: loop time, in seconds.
        on_audio: told of every frame of audio sent (PCM16 at ``rate``), for the echo gate.
    """

    def __init__(
        self,
        rate: int,
        *,
        voice: str,
        workers: Callable[[], Awaitable[VoiceWorkers]],
        conn: Callable[[], Connection | None],
        feed: Callable[[Event], None],
        clock: Callable[[], float],
        on_audio: Callable[[bytes, int], None],
    ) -> None:
        self.rate = rate
        self.voice = voice
        self._workers = workers
        self._conn = conn
        self._feed = feed
        self._clock = clock
        self._on_audio = on_audio
        self._frame_bytes = rate * FRAME_MS // 1000 * 2
        self._todo: deque[Speak | EndSpeech] = deque()
        self._wake = asyncio.Event()
        self._stopped: set[str] = set()
        """Answers stopped at a barge-in: what is left of them is dropped."""
        self._current: str | None = None
        """The answer whose audio is being sent, or was last."""
        self._sent = 0
        """Samples of the current answer's audio sent."""
        self._started_at: float | None = None
        """When its first frame was sent (``clock``)."""
        self._synthesis: asyncio.Task[None] | None = None
        self._task = asyncio.create_task(self._run(), name="gateway:speaker")

    # ----------------------------------------------------------------- the core's asks

    def speak(self, effect: Speak | EndSpeech) -> None:
        if effect.response_id not in self._stopped:
            self._todo.append(effect)
            self._wake.set()

    def stop(self, effect: StopSpeaking) -> None:
        """Stop ``effect.response_id`` now: its synthesis is cancelled, its segments not
        spoken yet are dropped, and ``SpeechDone`` (interrupted) says how much was sent."""
        response_id = effect.response_id
        if response_id in self._stopped:
            return
        self._stopped.add(response_id)
        self._todo = deque(item for item in self._todo if item.response_id != response_id)
        sent = 0
        if self._current == response_id:
            sent = self._sent_ms
            self._started_at = None  # nothing of it plays any more
            if self._synthesis is not None:
                self._synthesis.cancel()
        self._feed(SpeechDone(response_id, audio_ms=sent, interrupted=True))

    # ----------------------------------------------------------------- what plays

    @property
    def _sent_ms(self) -> int:
        """Milliseconds of the current answer's audio sent."""
        return self._sent * 1000 // self.rate

    def played_ms(self) -> int | None:
        """How much of the current answer's audio the device has played, as far as can be
        told; ``None`` when none is playing (nor about to: a segment is being made)."""
        busy = self._synthesis is not None or bool(self._todo)
        if self._started_at is None:
            return 0 if busy and self._current not in self._stopped else None
        elapsed = (self._clock() - self._started_at) * 1000
        if not busy and elapsed > self._sent_ms + PLAYBACK_SLACK * 1000:
            return None
        return int(min(elapsed, self._sent_ms))

    # ----------------------------------------------------------------- the work

    async def _run(self) -> None:
        while True:
            if not self._todo:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = self._todo.popleft()
            if item.response_id in self._stopped:
                continue
            if item.response_id != self._current:
                self._current, self._sent, self._started_at = item.response_id, 0, None
            if isinstance(item, EndSpeech):
                self._feed(SpeechDone(item.response_id, audio_ms=self._sent_ms))
                continue
            before = self._sent_ms
            self._synthesis = asyncio.create_task(self._synthesize(item))
            try:
                await asyncio.wait([self._synthesis])
            finally:
                task, self._synthesis = self._synthesis, None
            if task.cancelled():  # stopped: its SpeechDone is sent
                continue
            if (exc := task.exception()) is not None:
                log.warning("speech_failed", response_id=item.response_id, error=str(exc))
                self._feed(VoiceFailed(f"the answer could not be spoken: {exc}", item.response_id))
                self._send(item, b"", last=True)  # the segment's audio ends, failed or not
            self._feed(SegmentSpoken(item.response_id, len(item.text), self._sent_ms - before))

    async def _synthesize(self, item: Speak) -> None:
        workers = await self._workers()
        carry = b""
        async for pcm in workers.synthesize(item.text, self.rate, self.voice):
            carry += pcm
            # Whole frames go at once; the rest waits for more, or ends the segment below.
            while len(carry) > self._frame_bytes:
                self._send(item, carry[: self._frame_bytes])
                carry = carry[self._frame_bytes :]
        self._send(item, carry, last=True)  # maybe empty: the segment said nothing

    def _send(self, item: Speak, pcm: bytes, *, last: bool = False) -> None:
        if self._started_at is None and pcm:
            self._started_at = self._clock()
        conn = self._conn()
        if conn is not None:
            frame = encode_answer_audio(item.response_id, item.seq, self._sent_ms, pcm, last=last)
            conn.send_binary(BinaryFrame(frame))
        if pcm:
            self._on_audio(pcm, self.rate)
        self._sent += len(pcm) // 2

    async def aclose(self) -> None:
        self._task.cancel()
        if self._synthesis is not None:
            self._synthesis.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

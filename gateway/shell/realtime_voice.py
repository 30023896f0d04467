"""A session whose agent's model is speech-to-speech: its voice and its model steps, through
one upstream realtime session (``gateway.providers.realtime``).

``RealtimeVoice`` takes the place of ``SessionVoice`` (the gateway's own engines) for such a
session, and serves its model steps too. The upstream model hears the user's audio and
speaks; everything else stays in the session core, as with any model:

- the upstream's VAD and transcription become the core's ``SpeechStarted`` /
  ``SpeechStopped`` / ``Transcribed``: the user's turn is a message of the history, and the
  core starts a response for it (``CallModel``);
- a model step (``stream``) first gives the upstream what the history has that it has not
  (a typed message, tool outcomes, an async tool's result as context), then takes the
  upstream's next response: one it began by itself (Gemini answers every turn), or one it is
  asked for (``respond``). Its transcript is the step's text, its function calls the step's
  calls: the core runs them (client functions, server tools, async tools with their pending
  placeholder) and the next step sends each outcome upstream once, under the upstream's call
  id;
- the response's audio goes to the client as the answer's binary frames, resampled to the
  session's ``output_rate`` (``gateway.wire.audio_frame``), from the moment its response is
  known to the core;
- a barge-in (the core's ``StopSpeaking``) cancels the upstream response and truncates its
  audio to what played.

The history's share of an interrupted answer is estimated from the audio played at the
model's speaking rate (``MS_PER_CHAR``): the upstream sends transcript and audio unaligned.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from gateway.core.audio import AudioSettings
from gateway.core.event import (
    ClearAudio,
    CommitAudio,
    EndSpeech,
    Event,
    Listen,
    SegmentSpoken,
    Speak,
    SpeechDone,
    SpeechStarted,
    SpeechStopped,
    StopSpeaking,
    Transcribed,
    VoiceFailed,
)
from gateway.core.model import (
    ModelEvent,
    ModelFinish,
    ModelRequest,
    ModelText,
    ModelToolCall,
    ModelUsage,
)
from gateway.core.transcript import AssistantTurn, ContextNote, ToolOutcome, UserTurn
from gateway.errors import ProviderError
from gateway.providers.realtime import RealtimeProvider
from gateway.providers.realtime import upstream as up
from gateway.shell.connection import BinaryFrame, Connection
from gateway.shell.voice import AUDIO_OFF, VoiceEffect
from gateway.shell.voice_input import MAX_FRAME_MS
from gateway.shell.voice_output import FRAME_MS, PLAYBACK_SLACK
from gateway.voice.resample import Resampler
from gateway.wire.audio_frame import encode_answer_audio
from gateway.wire.v1 import DecodeFailure

__all__ = ["MS_PER_CHAR", "RealtimeVoice"]

log = structlog.get_logger("gateway.voice")

MS_PER_CHAR = 65
"""The speaking rate assumed to place a barge-in in an answer's text (about 15 characters a
second, as speech-to-speech models speak)."""
REOPEN_AFTER_S = 2.0
"""After an upstream session failed to open, the soonest the next attempt is made."""
ROTATE_QUIET_WAIT_S = 30.0
"""The longest a replacement waits for the user to finish a turn before it goes anyway."""
TURN_WAIT_S = 30.0
"""How long a step waits for the upstream to begin its response."""


@dataclass(slots=True, eq=False)
class _Turn:
    """One response of the upstream model."""

    events: asyncio.Queue[up.UpstreamEvent] = field(default_factory=asyncio.Queue)
    response_id: str | None = None
    """The core response that took it (its audio is sent under this id)."""
    audio: list[bytes] = field(default_factory=list)
    """Its audio, until a core response takes it."""


class RealtimeVoice:
    """One session's voice and model; see the module docstring.

    Args:
        provider: the agent's speech-to-speech model.
        conn: the session's socket now, if one is attached.
        feed: gives the session an event.
        model_request: what the model would get now (instructions, history, tools): the
            setup of an upstream session.
    """

    def __init__(
        self,
        provider: RealtimeProvider,
        *,
        conn: Callable[[], Connection | None],
        feed: Callable[[Event], None],
        model_request: Callable[[], ModelRequest],
    ) -> None:
        self.provider = provider
        self._conn = conn
        self._feed = feed
        self._model_request = model_request
        self._clock = asyncio.get_running_loop().time
        self._audio: AudioSettings | None = None
        self._upstream: up.Upstream | None = None
        self._opening: asyncio.Task[up.Upstream] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._to_upstream: Resampler | None = None
        self._from_upstream: Resampler | None = None
        # The model's responses
        self._turns: deque[_Turn] = deque()
        """Responses the upstream began that no step took yet, oldest first."""
        self._receiving: _Turn | None = None
        """The response the upstream is sending now."""
        self._turn_begun: asyncio.Event = asyncio.Event()
        self._known = 0
        """Items of the history the upstream has."""
        self._voiced: deque[str] = deque()
        """The user's spoken turns, as transcribed: the upstream has them already."""
        self._unheard = 0
        """Spoken turns heard as nothing, which an upstream that answers speech by itself
        may still answer."""
        self._refused = 0
        """Answers the upstream begins on its own for speech whose step a usage limit
        refused: cancelled upstream and dropped (``refuse``)."""
        self._step_calls: list[up.CallRequested] = []
        self._call_ids: dict[str, str] = {}
        """The core's call ids to the upstream's."""
        self._cancelled_calls: set[str] = set()
        self._seeded_calls: set[str] = set()
        """Calls of the history a session was given, under the gateway's ids."""
        # The answer's audio
        self._playing: str | None = None
        self._seqs: dict[str, list[int]] = {}
        """The segments of each response spoken, by ``seq`` (the frames name the latest)."""
        self._sent = 0
        """Samples of the playing response's audio sent."""
        self._started_at: float | None = None
        self._stopped: set[str] = set()
        # The upstream session's life
        self._failed_until = 0.0
        self._failure = ""
        self._resume_handle: str | None = None
        self._rotation_timer: asyncio.TimerHandle | None = None
        self._rotating = False
        self._step_lock = asyncio.Lock()
        """Held by a model step from its start to its end: a session is replaced between
        steps only (a call may be open then: its output goes to the new session)."""
        self._user_quiet = asyncio.Event()
        """The user is not in the middle of a turn (it would be lost with the session)."""
        self._user_quiet.set()
        self._speech_over: int | None = None
        """Where the user began speaking over an answer, not yet long enough to stop it."""
        self._heard_ms = 0
        """The user's audio sent to the upstream session, in ms (its VAD's clock)."""

    # ----------------------------------------------------------------- the core's effects

    def carry_out(self, effect: VoiceEffect) -> None:
        match effect:
            case Listen(audio=audio):
                self._listen(audio)
            case CommitAudio():
                self._soon(lambda u: u.commit_audio())
            case ClearAudio():
                self._soon(lambda u: u.clear_audio())
            case Speak(response_id=response_id, seq=seq, text=text):
                self._seqs.setdefault(response_id, []).append(seq)
                self._feed(SegmentSpoken(response_id, len(text), len(text) * MS_PER_CHAR))
            case EndSpeech(response_id=response_id):
                self._end(response_id)
            case StopSpeaking(response_id=response_id):
                self._stop(response_id)

    def _listen(self, audio: AudioSettings | None) -> None:
        self._audio = audio
        if audio is None:  # no more audio either way
            self._to_upstream = self._from_upstream = None
            return
        upstream_rates = self._rates()
        self._to_upstream = Resampler(audio.input_rate, upstream_rates[0])
        self._from_upstream = Resampler(upstream_rates[1], audio.output_rate)
        self._open_soon()  # the upstream hears the user from the first frame

    def _rates(self) -> tuple[int, int]:
        probe = self._upstream or self.provider.new_upstream()
        return probe.input_rate, probe.output_rate

    def _end(self, response_id: str) -> None:
        """The core response is over, and so its upstream responses: all of its audio came
        before their end. Each segment's audio ends with its last frame."""
        seqs = self._seqs.pop(response_id, [])
        conn = self._conn()
        if conn is not None and response_id not in self._stopped:
            for seq in seqs:
                frame = encode_answer_audio(response_id, seq, self._sent_ms, b"", last=True)
                conn.send_binary(BinaryFrame(frame))
        sent = self._sent_ms if self._playing == response_id else 0
        self._feed(SpeechDone(response_id, audio_ms=sent))

    def _stop(self, response_id: str) -> None:
        """Barge-in: the upstream stops its response and keeps what played of it."""
        if response_id in self._stopped:
            return
        self._stopped.add(response_id)
        self._seqs.pop(response_id, None)
        sent = played = 0
        if self._playing == response_id:
            sent, played = self._sent_ms, self.played_ms() or 0
            self._started_at = None
        self._soon(lambda u: u.cancel())
        self._soon(lambda u: u.truncate(played))
        self._feed(SpeechDone(response_id, audio_ms=sent, interrupted=True))

    # ----------------------------------------------------------------- the user's audio

    async def hear(self, pcm: bytes) -> None:
        audio, resampler = self._audio, self._to_upstream
        if audio is None or resampler is None:
            self._feed(AUDIO_OFF)
            return
        if not pcm or len(pcm) % 2 or len(pcm) * 1000 // (2 * audio.input_rate) > MAX_FRAME_MS:
            self._feed(
                DecodeFailure(
                    code="invalid_audio",
                    message=f"audio must be PCM16 frames of at most {MAX_FRAME_MS} ms,"
                    f" got {len(pcm)} bytes",
                )
            )
            return
        try:
            upstream = await self._ready()
            await upstream.send_audio(resampler.feed(pcm))
        except ProviderError:
            return  # said once, when the opening failed
        self._heard_ms += len(pcm) * 1000 // (2 * audio.input_rate)
        self._check_interrupt()

    # ----------------------------------------------------------------- the upstream session

    def _open_soon(self) -> None:
        if self._opening is None:
            self._opening = asyncio.create_task(self._open(), name="gateway:realtime-open")

    async def _ready(self) -> up.Upstream:
        """The upstream session, opened (or being opened) when there is none. After a
        failed opening, the next is tried ``REOPEN_AFTER_S`` later at the soonest: a
        frame of audio or a step meanwhile fails at once."""
        if self._opening is None and self._clock() < self._failed_until:
            raise ProviderError(self._failure)
        self._open_soon()
        assert self._opening is not None
        opening = self._opening
        try:
            return await asyncio.shield(opening)
        except ProviderError as exc:
            if self._opening is opening:
                self._opening = None
                self._failed_until = self._clock() + REOPEN_AFTER_S
                self._failure = f"the model's session could not be opened: {exc}"
                log.warning("realtime_upstream_failed", error=str(exc))
                self._feed(VoiceFailed(self._failure))  # the client hears why, once
            raise ProviderError(self._failure) from exc

    async def _open(self) -> up.Upstream:
        """A new upstream session, given the conversation so far (or resumed by the handle
        the last one gave), in place of the last one from now on."""
        upstream = self.provider.new_upstream()
        request = self._model_request()
        audio = self._audio
        resume, self._resume_handle = self._resume_handle, None
        setup = up.UpstreamSetup(
            instructions=request.instructions,
            tools=tuple(
                {"name": t.name, "description": t.description, "parameters": t.input_schema}
                for t in request.tools
            ),
            voice=audio.voice if audio is not None and audio.voice else None,
            silence_ms=audio.silence_ms if audio is not None else 500,
            history=request.items,
            resume_handle=resume,
        )
        await upstream.open(setup)
        if resume is not None:  # it has the conversation up to the last session's end
            known = self._known
        else:  # given the history: its calls go by the gateway's ids now
            known = len(request.items)
            self._call_ids = {}
            self._seeded_calls = {
                call.call_id
                for item in request.items
                if isinstance(item, AssistantTurn)
                for call in item.calls
            }
        old, self._upstream = self._upstream, upstream
        self._known, self._heard_ms, self._speech_over = known, 0, None
        self._pump = asyncio.create_task(self._read(upstream), name="gateway:realtime-read")
        if self.provider.max_session_s is not None:
            if self._rotation_timer is not None:
                self._rotation_timer.cancel()
            self._rotation_timer = asyncio.get_running_loop().call_later(
                self.provider.max_session_s, self._rotate_soon, "max_session_s"
            )
        if old is not None:
            self._later(old.aclose())
        log.info(
            "realtime_upstream_opened",
            provider=self.provider.name,
            seeded=0 if resume else len(request.items),
            resumed=resume is not None,
            replaced=old is not None,
        )
        return upstream

    def _rotate_soon(self, why: str) -> None:
        """Move the conversation to a new upstream session, once no response is under way
        (its step holds ``_step_lock``) and the user is not speaking."""
        if self._rotating:
            return
        self._rotating = True

        async def rotate() -> None:
            try:
                async with self._step_lock:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(ROTATE_QUIET_WAIT_S):
                            await self._user_quiet.wait()
                    log.info("realtime_upstream_rotating", reason=why)
                    self._opening = asyncio.create_task(self._open(), name="gateway:realtime-open")
                    await self._ready()
            except ProviderError as exc:
                log.warning("realtime_upstream_rotation_failed", reason=why, error=str(exc))
            finally:
                self._rotating = False

        self._later(rotate())

    def _later(self, work: Coroutine[Any, Any, object]) -> None:
        async def run() -> None:
            with contextlib.suppress(ProviderError):
                await work

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _soon(self, action: Callable[[up.Upstream], Coroutine[Any, Any, object]]) -> None:
        """Send something upstream without waiting for it (in order with the rest)."""

        async def send() -> None:
            await action(await self._ready())

        self._later(send())

    async def _read(self, upstream: up.Upstream) -> None:
        async for event in upstream.events():
            if upstream is self._upstream:  # a session replaced says nothing more
                self._take(event)

    def _take(self, event: up.UpstreamEvent) -> None:
        match event:
            case up.SpeechStarted(offset_ms=offset):
                self._user_quiet.clear()
                self._user_started(offset)
            case up.SpeechStopped(offset_ms=offset):
                self._user_stopped(offset)
            case up.UserTranscript(text=text):
                self._user_quiet.set()
                if text.strip():
                    self._voiced.append(text.strip())
                else:  # nothing said: the core starts no response, none takes the answer
                    self._unheard += 1
                self._feed(Transcribed(text, final=True))
            case up.TurnStarted():
                self._user_quiet.set()  # the model answers: whatever the user said is in
                turn = self._receiving = _Turn()
                upstream = self._upstream
                if self._unheard and upstream is not None and upstream.answers_speech:
                    self._unheard -= 1  # an answer to nothing: dropped
                elif self._refused and upstream is not None and upstream.answers_speech:
                    self._refused -= 1  # an answer its limits refused: stopped and dropped
                    self._soon(lambda u: u.cancel())
                else:
                    self._turns.append(turn)
                    self._turn_begun.set()
            case up.AudioDelta(pcm=pcm):
                self._audio_of(pcm)
            case up.TextDelta() | up.CallRequested() | up.TurnDone():
                if isinstance(event, up.TurnDone) and event.status == "cancelled":
                    # The upstream stopped its answer for the user's speech (Gemini's own
                    # VAD): a barge-in, however long the speech has lasted so far.
                    self._check_interrupt(now=True)
                if self._receiving is not None:
                    self._receiving.events.put_nowait(event)
                    if isinstance(event, up.TurnDone):
                        self._receiving = None
            case up.CallsCancelled(call_ids=ids):
                self._cancelled_calls.update(ids)
            case up.Closed(reason=reason, expired=expired):
                log.info("realtime_upstream_closed", reason=reason, expired=expired)
                self._upstream, self._opening = None, None  # the next need opens another
                if self._receiving is not None:
                    failed = up.TurnDone("failed", error=f"the model's session closed: {reason}")
                    self._receiving.events.put_nowait(failed)
                    self._receiving = None
                self._turn_begun.set()  # a step waiting for an answer fails now
                self._user_quiet.set()
            case up.GoingAway(time_left_s=left):
                log.info("realtime_upstream_going_away", time_left_s=left)
                self._rotate_soon("going_away")
            case up.Resumable(handle=handle):
                self._resume_handle = handle
            case up.Committed():
                pass  # its transcript follows (UserTranscript): the turn is over then

    def _user_started(self, offset: int) -> None:
        """Speech over an answer playing is a barge-in once it lasts ``interrupt_min_ms`` of
        the user's audio (``_check_interrupt``); a shorter sound is not."""
        if self.played_ms() is None or self._audio is None:
            self._feed(SpeechStarted(offset))
            return
        self._speech_over = offset
        self._check_interrupt()

    def _user_stopped(self, offset: int) -> None:
        if self._speech_over is not None:  # too short to stop the answer
            self._feed(SpeechStarted(self._speech_over))
            self._speech_over = None
        self._feed(SpeechStopped(offset))

    def _check_interrupt(self, *, now: bool = False) -> None:
        start, audio = self._speech_over, self._audio
        if start is None or audio is None:
            return
        if not now and self._heard_ms - start < audio.interrupt_min_ms:
            return
        self._speech_over = None
        played = self.played_ms()
        self._feed(SpeechStarted(start, interrupting=played is not None, played_ms=played or 0))

    # ----------------------------------------------------------------- the answer's audio

    def _audio_of(self, pcm: bytes) -> None:
        turn = self._receiving
        if turn is None:
            return
        if turn.response_id is None:
            turn.audio.append(pcm)
        else:
            self._send_audio(turn.response_id, pcm)

    def _send_audio(self, response_id: str, pcm: bytes) -> None:
        resampler, conn = self._from_upstream, self._conn()
        if resampler is None or response_id in self._stopped:
            return  # audio off, or the user spoke over it
        if self._playing != response_id:
            self._playing, self._sent, self._started_at = response_id, 0, None
        out = resampler.feed(pcm)
        seqs = self._seqs.get(response_id)
        seq = seqs[-1] if seqs else 0
        step = self._audio.output_rate * FRAME_MS // 1000 * 2 if self._audio else len(out)
        for start in range(0, len(out), step):
            piece = out[start : start + step]
            if self._started_at is None:
                self._started_at = self._clock()
            if conn is not None:
                frame = encode_answer_audio(response_id, seq, self._sent_ms, piece)
                conn.send_binary(BinaryFrame(frame))
            self._sent += len(piece) // 2

    @property
    def _sent_ms(self) -> int:
        rate = self._audio.output_rate if self._audio is not None else 24000
        return self._sent * 1000 // rate

    def played_ms(self) -> int | None:
        """How much of the answer playing the device has played, as far as can be told;
        ``None`` when none is."""
        if self._started_at is None:
            return None
        elapsed = (self._clock() - self._started_at) * 1000
        still_coming = self._receiving is not None and self._receiving.response_id == self._playing
        if not still_coming and elapsed > self._sent_ms + PLAYBACK_SLACK * 1000:
            return None
        return int(min(elapsed, self._sent_ms))

    # ----------------------------------------------------------------- model steps

    def provider_for(self, response_id: str) -> _StepModel:
        """The model of one step of ``response_id`` (``Provider`` for ``ModelStep``)."""
        return _StepModel(self, response_id)

    def refuse(self) -> None:
        """A step of this session was refused over a usage limit: an upstream that answers
        speech on its own has begun, or will begin, an answer nobody takes; it is cancelled
        (where the API can: Gemini Live cannot) and never relayed."""
        upstream = self._upstream
        if upstream is None or not upstream.answers_speech:
            return  # the gateway asks for every answer: none was asked
        if self._turns:
            self._turns.popleft()
            self._soon(lambda u: u.cancel())
        else:
            self._refused += 1

    async def step(self, request: ModelRequest, response_id: str) -> AsyncIterator[ModelEvent]:
        async with self._step_lock:
            async for event in self._step(request, response_id):
                yield event

    async def _step(self, request: ModelRequest, response_id: str) -> AsyncIterator[ModelEvent]:
        upstream = await self._ready()
        spoken_only = await self._sync(upstream, request)
        # A spoken turn alone: an upstream that answers speech by itself is not asked.
        turn = await self._next_turn(upstream, ask=not (spoken_only and upstream.answers_speech))
        turn.response_id = response_id
        for pcm in turn.audio:
            self._send_audio(response_id, pcm)
        turn.audio.clear()
        self._step_calls = []
        finished = False
        try:
            while True:
                event = await turn.events.get()
                match event:
                    case up.TextDelta(text=text):
                        yield ModelText(text)
                    case up.CallRequested():
                        self._step_calls.append(event)
                        yield ModelToolCall(
                            name=event.name, args=event.args, args_error=event.args_error
                        )
                    case up.TurnDone(status="failed", error=error):
                        finished = True
                        raise ProviderError(error or "the model's response failed")
                    case up.TurnDone(usage=usage):
                        finished = True
                        reason = "tool_calls" if self._step_calls else "stop"
                        yield ModelFinish(reason=reason, usage=_usage(usage))
                        return
        finally:
            if not finished and self._upstream is upstream:  # the step was cancelled
                self._soon(lambda u: u.cancel())

    async def _next_turn(self, upstream: up.Upstream, *, ask: bool) -> _Turn:
        """The upstream's next response not taken yet; asked for (``ask``) when none has
        begun."""
        if not self._turns:
            self._turn_begun.clear()
            if ask:
                await upstream.respond()
            try:
                async with asyncio.timeout(TURN_WAIT_S):
                    while not self._turns:
                        await self._turn_begun.wait()
                        self._turn_begun.clear()
                        if self._upstream is not upstream:
                            raise ProviderError("the model's session closed before it answered")
            except TimeoutError as exc:
                raise ProviderError("the model did not begin its response") from exc
        return self._turns.popleft()

    async def _sync(self, upstream: up.Upstream, request: ModelRequest) -> bool:
        """Give the upstream what the history has that it has not; whether that was only
        the user's spoken turn (which it has already)."""
        sent, voiced = False, False
        for item in request.items[self._known :]:
            match item:
                case UserTurn(text=text):
                    if self._voiced and self._voiced[0] == text.strip():
                        self._voiced.popleft()  # heard already
                        voiced = True
                    else:
                        await upstream.send_user_text(text)
                        sent = True
                case AssistantTurn(calls=calls):
                    for call, asked in zip(calls, self._step_calls, strict=False):
                        self._call_ids[call.call_id] = asked.call_id
                case ToolOutcome(call_id=call_id, name=name, output=output, error=error):
                    upstream_id = self._call_ids.pop(call_id, None)
                    if upstream_id is None and call_id in self._seeded_calls:
                        upstream_id = call_id  # a call of the history it was given
                    if upstream_id is not None and upstream_id not in self._cancelled_calls:
                        result = output if error is None else {"error": error}
                        await upstream.send_tool_output(upstream_id, name, result)
                        sent = True
                case ContextNote(text=text):
                    await upstream.send_context(text)
                    sent = True
        self._known = len(request.items)
        return voiced and not sent

    async def aclose(self) -> None:
        if self._rotation_timer is not None:
            self._rotation_timer.cancel()
        for task in [*self._tasks, *(t for t in (self._pump, self._opening) if t is not None)]:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            await upstream.aclose()
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)


class _StepModel:
    """One step of a speech-to-speech session, as a ``Provider`` for ``ModelStep``."""

    def __init__(self, link: RealtimeVoice, response_id: str) -> None:
        self._link = link
        self._response_id = response_id
        self.name = link.provider.name
        self.capabilities = link.provider.capabilities

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        return self._link.step(request, self._response_id)

    def refuse(self) -> None:
        """The step was not started (a usage limit): see ``RealtimeVoice.refuse``."""
        self._link.refuse()

    async def aclose(self) -> None:
        pass


def _usage(usage: up.UpstreamUsage | None) -> ModelUsage | None:
    if usage is None:
        return None
    return ModelUsage(
        input_tokens=usage.input_text_tokens + usage.input_audio_tokens,
        output_tokens=usage.output_text_tokens + usage.output_audio_tokens,
        input_audio_tokens=usage.input_audio_tokens,
        output_audio_tokens=usage.output_audio_tokens,
    )

"""A session's voice turns: what the user said out loud, and barge-in over a spoken answer.

Part of the pure session core: it never sees a sample. The shell's voice pipeline
(``gateway.shell.voice``) hears the audio and reports in words and milliseconds: the user
started or stopped speaking (``SpeechStarted``, ``SpeechStopped``), what they said
(``Transcribed``), how much audio each segment of an answer took (``SegmentSpoken``) and
when an answer's audio is all out (``SpeechDone``). This collaborator of ``Session`` turns
those into the events the client gets and into the conversation:

- a final transcript becomes the user's message, exactly as a ``user.message`` would
  (``Intake.admit``), answered at once or queued;
- a start of speech over an answer (``interrupting``: the pipeline checked that it lasted
  ``interrupt_min_ms`` and was not the answer's own echo) is a barge-in: the running
  response is cancelled (its settled calls stay settled: the ledger holds them), the
  answer's audio stops (``StopSpeaking``, ``audio.flush``), and the history keeps only the
  text of what had played, which a ``response.truncate`` with ``audio_end_ms`` from the
  client's player may cut further (``Responses.truncate``);
- ``audio.done`` follows the last audio frame of each answer.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.audio import AudioRequest, AudioSettings, apply_request
from gateway.core.event import (
    ClearAudio,
    CommitAudio,
    Listen,
    SegmentSpoken,
    SpeechDone,
    SpeechStarted,
    SpeechStopped,
    StopSpeaking,
    Transcribed,
    VoiceFailed,
)
from gateway.core.inbound import InputAudioClear, InputAudioCommit, UserMessage
from gateway.core.intake import Intake
from gateway.core.outbound import (
    AudioDone,
    AudioFlush,
    InputAudioCleared,
    InputSpeechStarted,
    InputSpeechStopped,
    InputTranscript,
)
from gateway.core.outbox import Outbox
from gateway.core.responses import Responses
from gateway.core.state import SessionState

__all__ = ["Speech"]


class Speech:
    """The voice turns of one session; see the module docstring."""

    __slots__ = ("_intake", "_new_id", "_out", "_responses", "_state", "_voices")

    def __init__(
        self,
        state: SessionState,
        *,
        intake: Intake,
        responses: Responses,
        outbox: Outbox,
        new_id: Callable[[str], str],
        voices: tuple[str, ...],
    ) -> None:
        self._state = state
        self._intake = intake
        self._responses = responses
        self._out = outbox
        self._new_id = new_id
        self._voices = voices

    # ----------------------------------------------------------------- settings

    def settings_for(
        self, request: AudioRequest | bool | None, msg_id: str | None
    ) -> tuple[bool, AudioSettings | None]:
        """Whether the audio ``request`` asks for (the ``audio`` of ``session.start`` or
        ``session.update``: ``None`` keeps what is on, ``False`` turns it off) can be had,
        and the settings it makes; when it cannot, the client got an ``error`` saying why
        and the caller changes nothing."""
        current = self._state.audio
        if request is None:
            return True, current
        if request is False:
            return True, None
        applied = apply_request(
            current, AudioRequest() if request is True else request, self._voices
        )
        if isinstance(applied, str):
            code = "audio_unavailable" if not self._voices else "invalid_message"
            self._out.error(code, applied, in_reply_to=msg_id)
            return False, None
        return True, applied

    def apply(self, audio: AudioSettings | None) -> None:
        """Run under ``audio`` from now on; the voice pipeline is told when it changed."""
        if audio != self._state.audio:
            self._state.audio = audio
            self._out.do(Listen(audio))

    def receive(
        self,
        event: Transcribed
        | SpeechStarted
        | SpeechStopped
        | SegmentSpoken
        | SpeechDone
        | InputAudioCommit
        | InputAudioClear
        | VoiceFailed,
    ) -> None:
        """Apply an event of the voice pipeline, or a client's ``input_audio`` message."""
        match event:
            case Transcribed():
                self.transcribed(event)
            case SpeechStarted():
                self.started(event)
            case SpeechStopped():
                self.stopped(event)
            case SegmentSpoken():
                self.segment_spoken(event)
            case SpeechDone():
                self.done(event)
            case InputAudioCommit():
                self.commit(event)
            case InputAudioClear():
                self.clear(event)
            case VoiceFailed():
                self.failed(event)

    # ----------------------------------------------------------------- the user's turn

    def commit(self, msg: InputAudioCommit) -> None:
        if self._audio_on(msg.id):
            self._out.do(CommitAudio())

    def clear(self, msg: InputAudioClear) -> None:
        if self._audio_on(msg.id):
            self._out.do(ClearAudio())
            self._out.send(InputAudioCleared(in_reply_to=msg.id))

    def _audio_on(self, msg_id: str | None) -> bool:
        if self._state.audio is None:
            self._out.error(
                "invalid_audio",
                "this session's audio is off: turn it on with session.update's audio first",
                in_reply_to=msg_id,
            )
        return self._state.audio is not None

    def started(self, event: SpeechStarted) -> None:
        self._out.send(InputSpeechStarted(offset_ms=event.offset_ms))
        if event.interrupting:
            self._barge_in(event.played_ms)

    def stopped(self, event: SpeechStopped) -> None:
        self._out.send(InputSpeechStopped(offset_ms=event.offset_ms))

    def transcribed(self, event: Transcribed) -> None:
        """A transcript of the user's turn; a final one that says something is their
        message."""
        if not event.final:
            self._out.send(InputTranscript(text=event.text, final=False))
            return
        text = event.text.strip()
        message_id = self._new_id("msg") if text else None
        self._out.send(InputTranscript(text=text, final=True, message_id=message_id))
        if text:
            message = UserMessage(id=message_id, text=text)
            if self._intake.admit(message):
                if self._state.response is None:
                    self._responses.start(message)
                else:
                    self._state.queue.append(message)

    def _barge_in(self, played_ms: int) -> None:
        """The user spoke over the answer: it stops, and the history keeps what played."""
        state = self._state
        spoken = state.spoken
        if spoken is not None:
            if not spoken.done:  # still being sent: the rest is not
                self._out.do(StopSpeaking(spoken.response_id))
            # Sent or not, the device may still be playing it: it stops now.
            self._out.send(AudioFlush(response_id=spoken.response_id))
        if state.response is not None:
            self._responses.cancel(state.response.response_id, start_next=False)
        if spoken is not None and spoken.response_id == state.latest_response:
            self._responses.keep_heard(spoken, played_ms)

    # ----------------------------------------------------------------- the answer's audio

    def segment_spoken(self, event: SegmentSpoken) -> None:
        spoken = self._state.spoken
        if spoken is not None and spoken.response_id == event.response_id and not spoken.done:
            spoken.add(event.chars, event.audio_ms)

    def done(self, event: SpeechDone) -> None:
        """The audio of ``event.response_id`` is all out, or was stopped."""
        spoken = self._state.spoken
        if spoken is not None and spoken.response_id == event.response_id:
            spoken.done = True
        self._out.send(
            AudioDone(
                response_id=event.response_id,
                audio_ms=event.audio_ms,
                status="interrupted" if event.interrupted else "completed",
            )
        )

    def failed(self, event: VoiceFailed) -> None:
        self._out.error(
            "speech_failed", event.message, response_id=event.response_id, retryable=True
        )

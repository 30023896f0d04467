"""Remote speech engines over the OpenAI-compatible audio APIs.

``/audio/transcriptions`` (speech-to-text) and ``/audio/speech`` (text-to-speech) are spoken by
OpenAI and by many local and hosted servers (Speaches, LocalAI, Kokoro-FastAPI, vLLM...).
``base_url`` is the API's root, ending in ``/v1`` as for the chat providers
(``https://api.openai.com/v1``, ``http://localhost:8000/v1``): the engines append the
endpoint's path to it.

The engines are synchronous and block on the network: the caller runs them off the event loop
(a thread or a worker process), as it does the offline ones. A server that fails (an error
status, an answer that is not what was asked, a lost connection) raises ``ProviderError``
naming the status and the server's own message, never the API key; its ``retryable`` says
whether the same request may well work later (408, 429 and 5xx statuses, a lost connection).

They need httpx only; ``OpenAITextToSpeech`` asked for a rate other than 24 kHz resamples with
soxr (``gateway.voice.resample``, the ``voice`` extra).
"""

from __future__ import annotations

import io
import json
import os
import wave
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx

from gateway.errors import ProviderError
from gateway.voice.base import SAMPLE_WIDTH, Transcript, check_pcm
from gateway.voice.resample import Resampler

__all__ = [
    "MAX_UTTERANCE_SECONDS",
    "SPEECH_RATE",
    "OpenAISpeechToText",
    "OpenAISpeechToTextStream",
    "OpenAITextToSpeech",
    "RemoteEngines",
    "load_remote",
]

MAX_UTTERANCE_SECONDS = 120.0
"""The longest utterance ``OpenAISpeechToText`` buffers by default (OpenAI takes files up to
25 MB: about 13 minutes of PCM16 at 16 kHz)."""

SPEECH_RATE = 24000
"""The rate of ``/audio/speech``'s raw PCM (``response_format: "pcm"``), as OpenAI defines it."""

_RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Besides the 5xx ones: the statuses after which the same request may well work."""
_ERROR_BODY_BYTES = 4096
"""How much of an error answer is read for its message."""
_PCM_TYPES = ("audio/pcm", "application/octet-stream")
"""The content types of raw PCM (OpenAI and aimock send ``audio/pcm``); a server that gives
none is taken at its word."""


class _Remote:
    """What both engines share: the client, the headers, and turning failures into errors."""

    def __init__(
        self, base_url: str, api_key: str | None, timeout: float, client: httpx.Client | None
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout
        self._owned = client is None  # close only a client of our own
        self._client = client if client is not None else httpx.Client(timeout=timeout)

    def close(self) -> None:
        """Close the HTTP client, if the engine made it (a client passed in stays open)."""
        if self._owned:
            self._client.close()

    def _url(self, path: str) -> str:
        return f"{self._base_url}/{path}"

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _error(self, message: str, *, retryable: bool) -> ProviderError:
        if self._api_key:  # servers mask the key they quote, but do not count on it
            message = message.replace(self._api_key, "***")
        error = ProviderError(f"speech server: {message}")
        error.retryable = retryable
        return error

    def _status_error(self, url: str, status: int, body: bytes) -> ProviderError:
        return self._error(
            f"HTTP {status} from {url}: {_server_message(body)}",
            retryable=status in _RETRYABLE_STATUSES or status >= 500,
        )

    def _failed(self, url: str, exc: httpx.RequestError) -> ProviderError:
        """A request that got no whole answer: unreachable, timed out, cut off..."""
        cause = str(exc) or type(exc).__name__
        return self._error(f"request to {url} failed: {cause}", retryable=True)


class OpenAISpeechToText(_Remote):
    """Speech-to-text over ``POST {base_url}/audio/transcriptions`` (Whisper and its kin).

    **Not streaming**: the API takes a whole file, so a stream buffers the utterance, gives no
    partial transcripts (``feed`` always returns ``None``) and sends it all at ``finish()``,
    which blocks for the server's answer. Each stream buffers at most ``max_seconds`` of audio.

    Args:
        base_url: the API's root, ending in ``/v1``.
        api_key: sent as ``Authorization: Bearer``; ``None`` sends none (a local server).
        model: the form's ``model`` (``whisper-1``, ``gpt-4o-mini-transcribe``...).
        language: the form's ``language`` (ISO-639-1, ``en``), else the server detects it.
        sample_rate: the rate ``feed`` takes, written in the WAV header (any rate: the server
            resamples).
        timeout: seconds for each step of the request (connect, write, read).
        client: an ``httpx.Client`` to share; else the engine makes one (``close()``).
        max_seconds: the cap of one utterance's audio.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str = "whisper-1",
        language: str | None = None,
        sample_rate: int = 16000,
        timeout: float = 30.0,
        client: httpx.Client | None = None,
        max_seconds: float = MAX_UTTERANCE_SECONDS,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive: {sample_rate}")
        super().__init__(base_url, api_key, timeout, client)
        self.model = model
        self.language = language
        self._sample_rate = sample_rate
        self.max_bytes = int(max_seconds * sample_rate) * SAMPLE_WIDTH

    @property
    def sample_rate(self) -> int:
        """The rate ``feed`` takes."""
        return self._sample_rate

    def stream(self) -> OpenAISpeechToTextStream:
        """A new utterance (buffered: see the class)."""
        return OpenAISpeechToTextStream(self)

    def transcribe(self, pcm: bytes) -> Transcript:
        """The final transcript of ``pcm`` (one utterance at ``sample_rate``), in one request."""
        check_pcm(pcm)
        if not pcm:
            return Transcript("", final=True)  # nothing said: no request (servers refuse it)
        url = self._url("audio/transcriptions")
        form = {"model": self.model, "response_format": "json"}
        if self.language:
            form["language"] = self.language
        files = {"file": ("speech.wav", _wav(pcm, self._sample_rate), "audio/wav")}
        try:
            response = self._client.post(
                url, data=form, files=files, headers=self._headers(), timeout=self._timeout
            )
        except httpx.RequestError as exc:
            raise self._failed(url, exc) from exc
        if response.status_code >= 400:
            raise self._status_error(url, response.status_code, response.content)
        try:
            text = response.json()["text"]
        except (ValueError, KeyError, TypeError):
            text = None
        if not isinstance(text, str):
            raise self._error(
                f"{url} answered no transcript: {_server_message(response.content)}",
                retryable=False,
            )
        return Transcript(text.strip(), final=True)


class OpenAISpeechToTextStream:
    """One utterance for ``OpenAISpeechToText``: buffered, sent at ``finish()``."""

    def __init__(self, engine: OpenAISpeechToText) -> None:
        self._engine = engine
        self._audio = bytearray()
        self._done = False

    def feed(self, pcm: bytes) -> Transcript | None:
        """Buffer ``pcm``; always ``None`` (the API gives no partials). Raises ``ValueError``
        for odd-length PCM, or audio past the engine's cap (the buffer keeps what it held)."""
        check_pcm(pcm)
        if self._done:
            raise RuntimeError("this utterance is finished: open another stream")
        if len(self._audio) + len(pcm) > self._engine.max_bytes:
            seconds = self._engine.max_bytes / SAMPLE_WIDTH / self._engine.sample_rate
            raise ValueError(f"the utterance is longer than this engine's cap of {seconds:g} s")
        self._audio += pcm
        return None

    def finish(self) -> Transcript:
        """Send the utterance and return its transcript (blocks for the server's answer)."""
        if self._done:
            raise RuntimeError("this utterance is already finished")
        self._done = True
        audio, self._audio = bytes(self._audio), bytearray()
        return self._engine.transcribe(audio)


class OpenAITextToSpeech(_Remote):
    """Text-to-speech over ``POST {base_url}/audio/speech`` with ``response_format: "pcm"``.

    The server answers raw PCM16 at 24 kHz (``SPEECH_RATE``), which is streamed: each chunk is
    yielded as it arrives (resampled when another rate is asked), so playback starts before the
    body is read. An answer in another format (a content type other than ``audio/pcm`` or
    ``application/octet-stream``: MP3, WAV, JSON...) is an error: the engine does not decode.

    Args:
        base_url: the API's root, ending in ``/v1``.
        api_key: sent as ``Authorization: Bearer``; ``None`` sends none (a local server).
        model: the body's ``model`` (``tts-1``, ``gpt-4o-mini-tts``, ``kokoro``...).
        voice: the body's ``voice`` (``alloy``...; each server names its own).
        timeout: seconds for each step of the request (connect, write, each read).
        client: an ``httpx.Client`` to share; else the engine makes one (``close()``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str = "tts-1",
        voice: str = "alloy",
        timeout: float = 30.0,
        client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, client)
        self.model = model
        self.voice = voice

    def synthesize(self, text: str, sample_rate: int, voice: str | None = None) -> Iterator[bytes]:
        """Speak ``text`` in ``voice`` (``None``: the engine's ``voice``): PCM16 mono chunks
        at ``sample_rate`` as the server sends them. A rate that is not positive raises
        ``ValueError`` at once. Closing the iterator early (barge-in) closes the response."""
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive: {sample_rate}")
        # soxr (the voice extra) only when there is something to resample.
        resampler = Resampler(SPEECH_RATE, sample_rate) if sample_rate != SPEECH_RATE else None
        return self._chunks(text, resampler, voice or self.voice)

    def _chunks(self, text: str, resampler: Resampler | None, voice: str) -> Iterator[bytes]:
        if not text.strip():
            return  # nothing to say: the API refuses an empty input
        url = self._url("audio/speech")
        body: dict[str, Any] = {
            "model": self.model,
            "input": text,
            "voice": voice,
            "response_format": "pcm",
        }
        try:
            with self._client.stream(
                "POST", url, json=body, headers=self._headers(), timeout=self._timeout
            ) as response:
                self._check(url, response)
                carry = b""  # an odd byte: half a sample, completed by the next chunk
                for chunk in response.iter_bytes():
                    data = carry + chunk
                    whole = len(data) - len(data) % SAMPLE_WIDTH
                    carry = data[whole:]
                    out = data[:whole] if resampler is None else resampler.feed(data[:whole])
                    if out:
                        yield out
                # A last odd byte (a server's bug) is half a sample: dropped.
        except httpx.RequestError as exc:
            raise self._failed(url, exc) from exc
        if resampler is not None and (tail := resampler.flush()):
            yield tail

    def _check(self, url: str, response: httpx.Response) -> None:
        """Raise for an error status or an answer that is not raw PCM."""
        if response.status_code >= 400:
            raise self._status_error(url, response.status_code, _read_some(response))
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type and content_type not in _PCM_TYPES:
            raise self._error(
                f"{url} answered {content_type}, not raw PCM "
                f"(response_format pcm): {_server_message(_read_some(response))}",
                retryable=False,
            )


def _wav(pcm: bytes, sample_rate: int) -> bytes:
    """``pcm`` (PCM16 mono) as a WAV file, in memory."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(SAMPLE_WIDTH)
        file.setframerate(sample_rate)
        file.writeframes(pcm)
    return buffer.getvalue()


def _read_some(response: httpx.Response) -> bytes:
    """The start of a streamed body (an error's message), not the whole of it."""
    body = b""
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) >= _ERROR_BODY_BYTES:
            break
    return body[:_ERROR_BODY_BYTES]


def _server_message(body: bytes) -> str:
    """The server's message in an error body (OpenAI's ``{"error": {"message": ...}}``, or
    ``{"detail": ...}`` as FastAPI servers answer), else the body's start as text."""
    text = body[:_ERROR_BODY_BYTES].decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300] or "(empty body)"
    if isinstance(value, dict):
        error = value.get("error", value)
        if isinstance(error, dict):
            error = error.get("message", error.get("detail", error))
        if isinstance(error, str):
            return error[:300]
    return json.dumps(value)[:300]


class RemoteEngines(NamedTuple):
    """The engines ``load_remote`` gives a speech worker."""

    stt: OpenAISpeechToText
    tts: OpenAITextToSpeech
    vad: Any


def load_remote() -> RemoteEngines:
    """The engines over an OpenAI-compatible audio API (``GATEWAY_VOICE=remote``), for a
    speech worker: speech-to-text and text-to-speech at ``GATEWAY_VOICE_URL`` (the API's root,
    ending in ``/v1``) with ``GATEWAY_VOICE_API_KEY`` (none for a local server) and the models
    ``GATEWAY_VOICE_STT_MODEL`` and ``GATEWAY_VOICE_TTS_MODEL``; the voice activity detector
    is the offline Silero (the ``voice`` extra), run in the worker. The gateway sets these
    variables in the worker's environment from its own settings (``gateway.shell.voice``).

    Raises:
        ValueError: ``GATEWAY_VOICE_URL`` is not set.
    """
    from gateway.voice.offline import SileroVAD

    url = os.environ.get("GATEWAY_VOICE_URL")
    if not url:
        raise ValueError("remote speech engines need GATEWAY_VOICE_URL (the API's root, /v1)")
    key = os.environ.get("GATEWAY_VOICE_API_KEY") or None
    stt_model = os.environ.get("GATEWAY_VOICE_STT_MODEL") or "whisper-1"
    tts_model = os.environ.get("GATEWAY_VOICE_TTS_MODEL") or "tts-1"
    return RemoteEngines(
        stt=OpenAISpeechToText(url, key, model=stt_model),
        tts=OpenAITextToSpeech(url, key, model=tts_model),
        vad=SileroVAD(),
    )

"""A speech worker process: loads the engines once and answers framed requests on stdin/stdout.

Run by ``gateway.voice.workers.VoiceWorkers`` as ``python -m gateway.voice.worker_main
MODULE:FUNCTION``, where the factory returns an object with ``.stt``, ``.tts`` and ``.vad``
(``gateway.voice.offline.load_offline`` gives ``OfflineEngines``). Each frame, both ways, is a
4-byte big-endian length and then one msgspec msgpack message (the ``Request`` and ``Reply``
unions below). Logs go to stderr, inherited from the gateway; anything an engine prints to
stdout is sent to stderr too, so it never corrupts a frame.

The worker serves requests one at a time, in the order they came. Only ``Cancel`` jumps the
queue: a reader thread takes it as it arrives, and the synthesis it names stops after the
chunk being made. ``Reference`` and ``ResetReference`` (a stream's echo gate) get no reply.
An engine's failure is sent back as ``Failed`` and the worker goes on. When
stdin closes, the worker finishes the request in hand and exits.
"""

from __future__ import annotations

import importlib
import os
import queue
import struct
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec

from gateway.voice.base import (
    SpeechToText,
    SpeechToTextEngine,
    Transcript,
    VoiceActivityDetector,
    check_pcm,
)

if TYPE_CHECKING:
    from gateway.voice.echo import EchoGate

__all__ = [
    "ECHO_WINDOW_MS",
    "HEADER",
    "NO_REPLY",
    "Cancel",
    "Chunk",
    "Done",
    "Failed",
    "Feed",
    "Finish",
    "Heard",
    "Open",
    "Opened",
    "Ready",
    "Reference",
    "Reply",
    "Request",
    "ResetReference",
    "Synthesize",
    "frame",
    "load_engines",
    "main",
]

HEADER = struct.Struct(">I")
"""Each frame's length prefix."""
ECHO_WINDOW_MS = 256
"""The input audio the echo gate judges for a frame: the 256 ms ending with it."""
ECHO_FROM = 0.5
"""The speech probability from which a frame is checked for echo (none under it is speech)."""


# --------------------------------------------------------------------------- requests


class Open(msgspec.Struct, tag="open"):
    """Open a transcription stream, named by this request's ``id``; with ``vad``, a voice
    activity detector runs on the same audio."""

    id: int
    vad: bool


class Feed(msgspec.Struct, tag="feed"):
    """The next PCM16 chunk of ``stream`` (at the recognizer's rate), for its VAD (``vad``),
    its recognizer (``stt``), or both."""

    id: int
    stream: int
    pcm: bytes
    vad: bool = True
    stt: bool = True


class Finish(msgspec.Struct, tag="finish"):
    """End ``stream``'s utterance: its final transcript. With ``keep``, the stream stays open
    (its VAD goes on) and its next ``stt`` audio starts a new utterance."""

    id: int
    stream: int
    keep: bool = False


class Reference(msgspec.Struct, tag="reference"):
    """Audio the user's device plays (PCM16 at ``sample_rate``), for ``stream``'s echo gate.
    No reply."""

    id: int
    stream: int
    pcm: bytes
    sample_rate: int


class ResetReference(msgspec.Struct, tag="reset_reference"):
    """Drop ``stream``'s echo reference. No reply."""

    id: int
    stream: int


class Synthesize(msgspec.Struct, tag="synthesize"):
    """Speak ``text`` at ``sample_rate``: ``Chunk`` replies, then ``Done``."""

    id: int
    text: str
    sample_rate: int
    voice: str | None = None


class Cancel(msgspec.Struct, tag="cancel"):
    """Stop the synthesis ``id`` after its current chunk (its ``Done`` still comes)."""

    id: int


Request = Open | Feed | Finish | Reference | ResetReference | Synthesize | Cancel
NO_REPLY = (Cancel, Reference, ResetReference)
"""The requests that get no reply (a failed ``Reference`` gets a ``Failed`` nobody waits for)."""


# ---------------------------------------------------------------------------- replies


class Ready(msgspec.Struct, tag="ready"):
    """The engines are loaded: the worker takes requests."""


class Opened(msgspec.Struct, tag="opened"):
    """A stream is open: its audio rate, and the VAD's frame size (0 without VAD)."""

    id: int
    sample_rate: int
    frame_samples: int


class Heard(msgspec.Struct, tag="heard"):
    """A feed's (or a finish's) transcript, the speech probability of each whole VAD frame
    the feed completed, and for each of those frames whether it is the echo of the
    stream's reference (``gateway.voice.echo``: the 256 ms ending at the frame; only for a
    frame of probability 0.5 or more while a reference is kept, else False)."""

    id: int
    transcript: Transcript | None
    probabilities: list[float]
    echo: list[bool] = msgspec.field(default_factory=list)


class Chunk(msgspec.Struct, tag="chunk"):
    """One chunk of a synthesis, PCM16."""

    id: int
    pcm: bytes


class Done(msgspec.Struct, tag="done"):
    """A synthesis ended (all its chunks sent, or cancelled)."""

    id: int


class Failed(msgspec.Struct, tag="failed"):
    """Request ``id`` failed: the exception's class name and message (``id`` 0: loading
    the engines failed, and the worker exits)."""

    id: int
    kind: str
    message: str


Reply = Ready | Opened | Heard | Chunk | Done | Failed

_encoder = msgspec.msgpack.Encoder()


def frame(message: Request | Reply) -> bytes:
    """``message`` as a frame: its length, then its msgpack."""
    payload = _encoder.encode(message)
    return HEADER.pack(len(payload)) + payload


def load_engines(spec: str) -> Any:
    """Call the factory ``spec`` names (``"package.module:function"``)."""
    module, _, function = spec.partition(":")
    if not module or not function:
        raise ValueError(f"engines must be 'module:function', not {spec!r}")
    factory: Callable[[], Any] = getattr(importlib.import_module(module), function)
    return factory()


# ----------------------------------------------------------------------------- serving


class _Stream:
    """One open transcription: the recognizer's utterance (``None`` until its first audio,
    and again after a kept finish), its VAD, the VAD's partial frame and the echo gate."""

    def __init__(self, engine: SpeechToTextEngine, vad: VoiceActivityDetector | None) -> None:
        self.engine = engine
        self.stt: SpeechToText | None = None
        self.vad = vad
        self.carry = bytearray()
        self.gate: EchoGate | None = None
        """Made at the first reference: a stream never given one costs nothing."""
        self.history = bytearray()
        """The last ``ECHO_WINDOW_MS`` of the VAD's audio, for the echo gate."""
        self.heard = 0
        """Samples the VAD has had (whole frames): where the history ends."""

    def recognize(self, pcm: bytes) -> Transcript | None:
        """Feed the recognizer, starting an utterance if none is under way."""
        if not pcm:
            return None
        if self.stt is None:
            self.stt = self.engine.stream()
        return self.stt.feed(pcm)

    def finish(self) -> Transcript:
        """End the utterance: its final transcript (empty if it had no audio)."""
        stt, self.stt = self.stt, None
        return Transcript("", final=True) if stt is None else stt.finish()

    def reference(self, pcm: bytes, sample_rate: int) -> None:
        if self.vad is None:
            raise ValueError("the echo gate needs a stream opened with VAD")
        if self.gate is None:
            from gateway.voice.echo import EchoGate  # numpy: the ``voice`` extra

            self.gate = EchoGate(self.vad.sample_rate)
        self.gate.reference(pcm, sample_rate)

    def detect(self, pcm: bytes) -> tuple[list[float], list[bool]]:
        """The VAD's probabilities of the whole frames ``pcm`` completes, and their echo."""
        if self.vad is None:
            return [], []
        self.carry += pcm
        size = self.vad.frame_bytes
        window = self.vad.sample_rate * ECHO_WINDOW_MS // 1000 * 2
        probabilities, echo = [], []
        while len(self.carry) >= size:
            frame = bytes(self.carry[:size])
            del self.carry[:size]
            probability = self.vad.speech_probability(frame)
            self.heard += size // 2
            self.history += frame
            del self.history[:-window]
            probabilities.append(probability)
            echo.append(
                probability >= ECHO_FROM
                and self.gate is not None
                and self.gate.is_echo(bytes(self.history), end=self.heard)
            )
        return probabilities, echo


class _Server:
    def __init__(self, engines: Any, out: BinaryIO) -> None:
        self._engines = engines
        self._out = out
        self._streams: dict[int, _Stream] = {}
        self.cancelled: set[int] = set()
        """Syntheses to stop; the reader thread adds to it (a set's add is atomic)."""

    def send(self, reply: Reply) -> None:
        self._out.write(frame(reply))
        self._out.flush()

    def handle(self, request: Request) -> None:
        try:
            if isinstance(request, Synthesize):
                self._synthesize(request)
            elif isinstance(request, Reference | ResetReference):
                self._no_reply(request)
            else:
                self.send(self._answer(request))
        except Exception as exc:  # the engine's failure goes back; the worker lives
            self.send(Failed(request.id, type(exc).__name__, str(exc)))

    def _answer(self, request: Request) -> Reply:
        if isinstance(request, Open):
            return self._open(request)
        if isinstance(request, Feed):
            check_pcm(request.pcm)  # before the recognizer or the VAD sees any of it
            stream = self._stream(request.stream)
            transcript = stream.recognize(request.pcm) if request.stt else None
            probabilities, echo = stream.detect(request.pcm) if request.vad else ([], [])
            return Heard(request.id, transcript, probabilities, echo)
        if isinstance(request, Finish):
            stream = self._stream(request.stream)
            if not request.keep:
                del self._streams[request.stream]
            return Heard(request.id, stream.finish(), [])
        raise TypeError(f"unexpected request {type(request).__name__}")

    def _no_reply(self, request: Reference | ResetReference) -> None:
        stream = self._stream(request.stream)
        if isinstance(request, Reference):
            check_pcm(request.pcm)
            stream.reference(request.pcm, request.sample_rate)
        elif stream.gate is not None:
            stream.gate.reset()

    def _open(self, request: Open) -> Opened:
        engine, vad = self._engines.stt, None
        if request.vad:
            # One detector per stream: the VAD is stateful. Its class must build with no
            # arguments (SileroVAD does) and take the recognizer's rate.
            vad = type(self._engines.vad)()
            if vad.sample_rate != engine.sample_rate:
                raise ValueError(
                    f"the VAD takes {vad.sample_rate} Hz, the recognizer {engine.sample_rate} Hz"
                )
        # The recognizer's utterance starts at its first audio: a stream that only listens
        # (its VAD, between the user's turns) holds no decoder.
        self._streams[request.id] = _Stream(engine, vad)
        frame_samples = 0 if vad is None else vad.frame_bytes // 2
        return Opened(request.id, engine.sample_rate, frame_samples)

    def _stream(self, stream: int) -> _Stream:
        try:
            return self._streams[stream]
        except KeyError:
            raise RuntimeError(f"no open transcription stream {stream}") from None

    def _synthesize(self, request: Synthesize) -> None:
        try:
            for pcm in self._engines.tts.synthesize(
                request.text, request.sample_rate, request.voice
            ):
                if request.id in self.cancelled:
                    break
                self.send(Chunk(request.id, pcm))
        finally:
            self.cancelled.discard(request.id)
        self.send(Done(request.id))


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd``, or ``None`` at the end of the input."""
    data = bytearray()
    while len(data) < size:
        part = os.read(fd, size - len(data))
        if not part:
            return None
        data += part
    return bytes(data)


def _read_requests(fd: int, server: _Server, requests: queue.Queue[Request | None]) -> None:
    """The reader thread: requests into the queue, except ``Cancel``, applied at once."""
    decoder = msgspec.msgpack.Decoder(Request)
    try:
        while (header := _read_exactly(fd, HEADER.size)) is not None:
            payload = _read_exactly(fd, HEADER.unpack(header)[0])
            if payload is None:
                break
            request = decoder.decode(payload)
            if isinstance(request, Cancel):
                server.cancelled.add(request.id)
            else:
                requests.put(request)
    finally:
        requests.put(None)  # the end: the main thread exits


NICENESS = 5
"""How much less CPU a worker gets than the gateway's event loop when both want it: a busy
machine slows the speech, never every session's socket (CFS gives a niceness of 5 about a
third of the weight of 0)."""


def main(argv: list[str]) -> int:
    """Serve the engines named by ``argv[0]`` until stdin closes."""
    os.nice(NICENESS)
    # Frames go to a copy of stdout; the real stdout becomes stderr, for chatty engines.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    server = _Server(None, out)
    try:
        server = _Server(load_engines(argv[0]), out)
    except Exception as exc:
        server.send(Failed(0, type(exc).__name__, f"loading the engines failed: {exc}"))
        return 1
    requests: queue.Queue[Request | None] = queue.Queue()
    threading.Thread(
        target=_read_requests, args=(0, server, requests), name="requests", daemon=True
    ).start()
    server.send(Ready())
    try:
        while (request := requests.get()) is not None:
            server.handle(request)
    except BrokenPipeError:  # the gateway is gone
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["gateway.voice.offline:load_offline"]))

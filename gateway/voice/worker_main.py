"""A speech worker process: loads the engines once and answers framed requests on stdin/stdout.

Run by ``gateway.voice.workers.VoiceWorkers`` as ``python -m gateway.voice.worker_main
MODULE:FUNCTION``, where the factory returns an object with ``.stt``, ``.tts`` and ``.vad``
(``gateway.voice.offline.load_offline`` gives ``OfflineEngines``). Each frame, both ways, is a
4-byte big-endian length and then one msgspec msgpack message (the ``Request`` and ``Reply``
unions below). Logs go to stderr, inherited from the gateway; anything an engine prints to
stdout is sent to stderr too, so it never corrupts a frame.

The worker serves requests one at a time, in the order they came. Only ``Cancel`` jumps the
queue: a reader thread takes it as it arrives, and the synthesis it names stops after the
chunk being made. An engine's failure is sent back as ``Failed`` and the worker goes on. When
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
from typing import Any, BinaryIO

import msgspec

from gateway.voice.base import SpeechToText, Transcript, VoiceActivityDetector, check_pcm

__all__ = [
    "HEADER",
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
    "Reply",
    "Request",
    "Synthesize",
    "frame",
    "load_engines",
    "main",
]

HEADER = struct.Struct(">I")
"""Each frame's length prefix."""


# --------------------------------------------------------------------------- requests


class Open(msgspec.Struct, tag="open"):
    """Open a transcription stream, named by this request's ``id``; with ``vad``, a voice
    activity detector runs on the same audio."""

    id: int
    vad: bool


class Feed(msgspec.Struct, tag="feed"):
    """The next PCM16 chunk of ``stream`` (at the recognizer's rate)."""

    id: int
    stream: int
    pcm: bytes


class Finish(msgspec.Struct, tag="finish"):
    """End ``stream``: its final transcript."""

    id: int
    stream: int


class Synthesize(msgspec.Struct, tag="synthesize"):
    """Speak ``text`` at ``sample_rate``: ``Chunk`` replies, then ``Done``."""

    id: int
    text: str
    sample_rate: int


class Cancel(msgspec.Struct, tag="cancel"):
    """Stop the synthesis ``id`` after its current chunk (its ``Done`` still comes)."""

    id: int


Request = Open | Feed | Finish | Synthesize | Cancel


# ---------------------------------------------------------------------------- replies


class Ready(msgspec.Struct, tag="ready"):
    """The engines are loaded: the worker takes requests."""


class Opened(msgspec.Struct, tag="opened"):
    """A stream is open: its audio rate, and the VAD's frame size (0 without VAD)."""

    id: int
    sample_rate: int
    frame_samples: int


class Heard(msgspec.Struct, tag="heard"):
    """A feed's (or a finish's) transcript, and the speech probability of each whole VAD
    frame the feed completed."""

    id: int
    transcript: Transcript | None
    probabilities: list[float]


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
    """One open transcription: the recognizer's stream, its VAD and the VAD's partial frame."""

    def __init__(self, stt: SpeechToText, vad: VoiceActivityDetector | None) -> None:
        self.stt = stt
        self.vad = vad
        self.carry = bytearray()

    def feed(self, pcm: bytes) -> list[float]:
        """The VAD's probabilities of the whole frames ``pcm`` completes."""
        if self.vad is None:
            return []
        self.carry += pcm
        size = self.vad.frame_bytes
        probabilities = []
        while len(self.carry) >= size:
            probabilities.append(self.vad.speech_probability(bytes(self.carry[:size])))
            del self.carry[:size]
        return probabilities


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
            transcript = stream.stt.feed(request.pcm)
            return Heard(request.id, transcript, stream.feed(request.pcm))
        if isinstance(request, Finish):
            stream = self._stream(request.stream)
            del self._streams[request.stream]
            return Heard(request.id, stream.stt.finish(), [])
        raise TypeError(f"unexpected request {type(request).__name__}")

    def _open(self, request: Open) -> Opened:
        stt, vad = self._engines.stt, None
        if request.vad:
            # One detector per stream: the VAD is stateful. Its class must build with no
            # arguments (SileroVAD does) and take the recognizer's rate.
            vad = type(self._engines.vad)()
            if vad.sample_rate != stt.sample_rate:
                raise ValueError(
                    f"the VAD takes {vad.sample_rate} Hz, the recognizer {stt.sample_rate} Hz"
                )
        self._streams[request.id] = _Stream(stt.stream(), vad)
        frame_samples = 0 if vad is None else vad.frame_bytes // 2
        return Opened(request.id, stt.sample_rate, frame_samples)

    def _stream(self, stream: int) -> _Stream:
        try:
            return self._streams[stream]
        except KeyError:
            raise RuntimeError(f"no open transcription stream {stream}") from None

    def _synthesize(self, request: Synthesize) -> None:
        try:
            for pcm in self._engines.tts.synthesize(request.text, request.sample_rate):
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


def main(argv: list[str]) -> int:
    """Serve the engines named by ``argv[0]`` until stdin closes."""
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

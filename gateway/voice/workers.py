"""The speech engines off the event loop: a pool of worker processes (docs/voice.md).

The engines are synchronous and CPU-bound: run on the event loop, one session's speech would
stall every other session's socket. ``VoiceWorkers`` runs them in worker processes
(``python -m gateway.voice.worker_main``), each of which loads its engines once and answers
framed msgpack messages on its stdin and stdout; the loop only moves bytes.

- A transcription is pinned to one worker, the least busy when it opens: the stream's state
  (the recognizer's decoder, the VAD's) lives there.
- A synthesis goes to the least busy worker and yields each chunk as the engine makes it.
  Leaving the iteration early (``aclose()``, a cancelled task: barge-in) tells the worker to
  stop after its current chunk.
- Requests carry ids and replies are matched by id; one worker serves its requests one at a
  time, in order.
- A worker that dies fails its pending requests, and every later request of its
  transcriptions, with ``SpeechEngineError``; the pool replaces it on its next request (which
  waits for the new worker to load its engines).
- A request an engine fails on raises the engine's error: ``ValueError`` as itself (odd-length
  PCM, an unsupported rate), anything else as ``SpeechEngineError``. The worker lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
from collections.abc import AsyncGenerator, Mapping
from types import TracebackType

import msgspec

from gateway.errors import ProviderError
from gateway.voice.base import Transcript, check_pcm
from gateway.voice.worker_main import (
    HEADER,
    NO_REPLY,
    Cancel,
    Chunk,
    Done,
    Failed,
    Feed,
    Finish,
    Heard,
    Open,
    Opened,
    Ready,
    Reference,
    Reply,
    Request,
    ResetReference,
    Synthesize,
    frame,
)

__all__ = ["OFFLINE", "Heard", "SpeechEngineError", "Transcription", "VoiceWorkers"]

OFFLINE = "gateway.voice.offline:load_offline"
"""The factory of the offline engines (the ``voice`` extra)."""


class SpeechEngineError(ProviderError):
    """A speech worker failed: it died (``retryable``: the pool replaces it), its engines did
    not load, or an engine raised something other than ``ValueError``."""


_decoder = msgspec.msgpack.Decoder(Reply)


def _error(failed: Failed) -> Exception:
    """The exception a ``Failed`` reply stands for."""
    if failed.kind == "ValueError":
        return ValueError(failed.message)
    if failed.kind == "died":  # the worker died: retryable, on its replacement
        return SpeechEngineError(failed.message)
    error = SpeechEngineError(f"speech engine failed: {failed.kind}: {failed.message}")
    error.retryable = False
    return error


class _Worker:
    """One worker process, seen from the event loop."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pending: dict[int, asyncio.Queue[Reply]] = {}
        """Each request's replies, by id."""
        self.streams = 0
        """Transcriptions open on this worker."""
        self.dead = False
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def spawn(cls, engines: str, env: Mapping[str, str] | None = None) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.voice.worker_main",
            engines,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
        )
        worker = cls(process)
        reply = await worker._receive()
        if not isinstance(reply, Ready):
            await worker.aclose(grace=1.0)
            why = reply.message if isinstance(reply, Failed) else "it exited"
            raise SpeechEngineError(f"a speech worker did not start: {why}")
        worker._reader = asyncio.create_task(worker._read(), name="voice-worker-reader")
        return worker

    @property
    def load(self) -> int:
        return len(self.pending) + self.streams

    def send(self, request: Request) -> asyncio.Queue[Reply]:
        """Send ``request``; its replies come into the queue returned."""
        if self.dead:
            raise SpeechEngineError(f"speech worker {self.process.pid} died")
        replies: asyncio.Queue[Reply] = asyncio.Queue()
        if not isinstance(request, NO_REPLY):
            self.pending[request.id] = replies
        assert self.process.stdin is not None
        self.process.stdin.write(frame(request))
        return replies

    async def call(self, request: Request) -> Reply:
        """Send ``request`` and wait for its one reply (a ``Failed`` one raises)."""
        replies = self.send(request)
        try:
            await self.drain()
            reply = await replies.get()
        finally:
            self.pending.pop(request.id, None)
        if isinstance(reply, Failed):
            raise _error(reply)
        return reply

    async def drain(self) -> None:
        assert self.process.stdin is not None
        # A dead worker's pipe breaks: its reader fails the pending requests.
        with contextlib.suppress(ConnectionError):
            await self.process.stdin.drain()

    async def _receive(self) -> Reply | None:
        """The next reply, or ``None`` when the worker's stdout ends."""
        assert self.process.stdout is not None
        try:
            header = await self.process.stdout.readexactly(HEADER.size)
            payload = await self.process.stdout.readexactly(HEADER.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return _decoder.decode(payload)

    async def _read(self) -> None:
        try:
            while (reply := await self._receive()) is not None:
                replies = self.pending.get(getattr(reply, "id", 0))
                if replies is not None:  # else a cancelled synthesis's late chunk
                    replies.put_nowait(reply)
        finally:
            self.dead = True
            died = f"speech worker {self.process.pid} died"
            for request_id, replies in self.pending.items():
                replies.put_nowait(Failed(request_id, "died", died))

    async def aclose(self, grace: float) -> None:
        """Close stdin (the worker exits once its request in hand is done); kill it after
        ``grace`` seconds."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            await self._reader


class Transcription:
    """A stream of the user's audio on one worker (``VoiceWorkers.open_transcription``): one
    utterance transcribed, or, with ``finish(keep=True)``, one after another while its VAD
    listens to all the audio between them (``hear`` chooses who hears each chunk). With VAD,
    an echo gate (``gateway.voice.echo``) tells which speech frames are the answer's own
    audio coming back from the user's speaker (``reference``).

    Attributes:
        sample_rate: the rate ``feed`` takes (the recognizer's).
        frame_samples: the VAD's frame size, for ``TurnDetector`` (0 without VAD).
    """

    def __init__(self, worker: _Worker, ids: itertools.count[int], opened: Opened) -> None:
        self._worker = worker
        self._ids = ids
        self._stream = opened.id
        self._finished = False
        self._utterance = False
        """Whether the recognizer had audio since the stream opened or its last finish."""
        self.sample_rate = opened.sample_rate
        self.frame_samples = opened.frame_samples

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._worker.process.pid

    async def feed(self, pcm: bytes) -> Transcript | None:
        """The next PCM16 chunk: the partial transcript when it changed, else ``None``."""
        return (await self.hear(pcm)).transcript

    async def hear(self, pcm: bytes, *, vad: bool = True, stt: bool = True) -> Heard:
        """Feed ``pcm`` to the VAD (``vad``), the recognizer (``stt``), or both: its
        ``transcript`` (as ``feed``; ``None`` without ``stt``) and, with VAD, the speech
        ``probabilities`` of the whole VAD frames it completed (a partial frame waits in the
        worker for the next chunk) and their ``echo`` flags. Without ``vad`` the VAD's state
        is untouched and no probabilities come back. Odd-length ``pcm`` raises
        ``ValueError``, and the stream goes on as if it was never sent."""
        if not (vad or stt):
            check_pcm(pcm)
            return Heard(0, None, [], [])
        reply = await self._worker.call(Feed(next(self._ids), self._stream, pcm, vad, stt))
        assert isinstance(reply, Heard)
        if stt and pcm:
            self._utterance = True
        return reply

    async def finish(self, *, keep: bool = False) -> Transcript:
        """The final transcript of the utterance. Without ``keep`` the stream takes no more
        audio. With ``keep`` it stays open: its VAD goes on, and the next audio for the
        recognizer starts a new utterance (an utterance with no audio is ``""``, at once)."""
        if self._finished:
            raise RuntimeError("this transcription is already finished")
        if keep and not self._utterance:
            return Transcript("", final=True)
        self._utterance = False
        if not keep:
            self._finished = True
            self._worker.streams -= 1
        reply = await self._worker.call(Finish(next(self._ids), self._stream, keep))
        assert isinstance(reply, Heard)
        assert reply.transcript is not None
        return reply.transcript

    async def reference(self, pcm: bytes, sample_rate: int) -> None:
        """Audio the user's device is playing (the answer's, PCM16 at ``sample_rate``), for
        the echo gate; no reply is awaited. Needs a stream opened with VAD. Odd-length
        ``pcm`` or a rate that is not positive raises ``ValueError``."""
        check_pcm(pcm)
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, not {sample_rate}")
        if not self.frame_samples:
            raise ValueError("the echo gate needs a transcription opened with vad=True")
        self._post(Reference(next(self._ids), self._stream, pcm, sample_rate))
        await self._worker.drain()

    async def reset_reference(self) -> None:
        """Drop the echo reference (a new answer starts, or its playback was flushed)."""
        self._post(ResetReference(next(self._ids), self._stream))
        await self._worker.drain()

    def _post(self, request: Reference | ResetReference) -> None:
        if self._finished:
            raise RuntimeError("this transcription is already finished")
        self._worker.send(request)

    async def aclose(self) -> None:
        """Finish the stream if it is not finished, for its transcript is not wanted (the
        session ended, the turn was dropped): the worker frees the stream's decoder. A dead
        worker's error is ignored; a second call does nothing."""
        if not self._finished:
            with contextlib.suppress(SpeechEngineError, ValueError):
                await self.finish()


class VoiceWorkers:
    """A pool of speech worker processes (module docstring). Build with ``start``; end with
    ``aclose`` or ``async with``."""

    def __init__(
        self, engines: str, workers: list[_Worker], env: Mapping[str, str] | None = None
    ) -> None:
        self._engines = engines
        self._env = env
        self._workers = workers
        self._ids = itertools.count(1)
        self._replacing = asyncio.Lock()

    @classmethod
    async def start(
        cls, processes: int = 2, engines: str = OFFLINE, env: Mapping[str, str] | None = None
    ) -> VoiceWorkers:
        """Spawn ``processes`` workers, each loading the engines ``engines`` names
        (``"module:function"``, a factory returning ``.stt``, ``.tts`` and ``.vad``), with
        ``env`` added to their environment (a factory's settings), and wait until all are
        ready (about 2 s for the offline engines)."""
        if processes < 1:
            raise ValueError("a pool needs at least one worker process")
        spawned = await asyncio.gather(
            *(_Worker.spawn(engines, env) for _ in range(processes)), return_exceptions=True
        )
        workers = [w for w in spawned if isinstance(w, _Worker)]
        failures = [e for e in spawned if isinstance(e, BaseException)]
        if failures:
            await asyncio.gather(*(w.aclose(grace=1.0) for w in workers))
            raise failures[0]
        return cls(engines, workers, env)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.process.pid for w in self._workers]

    async def _pick(self) -> _Worker:
        """The least busy worker, after replacing the dead ones."""
        if any(w.dead for w in self._workers):
            async with self._replacing:
                for n, worker in enumerate(self._workers):
                    if worker.dead:
                        await worker.aclose(grace=1.0)  # reap it
                        self._workers[n] = await _Worker.spawn(self._engines, self._env)
        return min(self._workers, key=lambda w: w.load)

    async def open_transcription(self, vad: bool = False) -> Transcription:
        """A new utterance on the least busy worker, pinned there; with ``vad``, each
        ``Transcription.hear`` also gives the VAD's speech probabilities, and the stream can take
        an echo reference (``Transcription.reference``)."""
        worker = await self._pick()
        reply = await worker.call(Open(next(self._ids), vad))
        assert isinstance(reply, Opened)
        worker.streams += 1
        return Transcription(worker, self._ids, reply)

    async def synthesize(
        self, text: str, sample_rate: int, voice: str | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Speak ``text`` in ``voice`` (``None``: the engine's own): PCM16 chunks at
        ``sample_rate``, each as soon as the worker's engine makes it. Leaving early
        (``aclose()`` or cancellation) stops the synthesis after the chunk in hand. An
        unsupported rate, or a voice the engine lacks, raises ``ValueError``."""
        worker = await self._pick()
        request = Synthesize(next(self._ids), text, sample_rate, voice)
        replies = worker.send(request)
        done = False
        try:
            await worker.drain()
            while not isinstance(reply := await replies.get(), Done):
                if isinstance(reply, Failed):
                    done = True
                    raise _error(reply)
                assert isinstance(reply, Chunk)
                yield reply.pcm
            done = True
        finally:
            worker.pending.pop(request.id, None)
            if not done and not worker.dead:
                worker.send(Cancel(request.id))  # no drain: this may run while cancelled

    async def aclose(self, grace: float = 5.0) -> None:
        """End the workers: each finishes the request in hand and exits; one still running
        after ``grace`` seconds is killed."""
        await asyncio.gather(*(w.aclose(grace) for w in self._workers))

    async def __aenter__(self) -> VoiceWorkers:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

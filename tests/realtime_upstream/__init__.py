"""A scripted realtime speech-to-speech upstream for tests: OpenAI Realtime (GA) and Gemini Live.

One asyncio WebSocket server on 127.0.0.1, port 0, speaks both protocols by path:

- ``/v1/realtime`` (``openai_url``): OpenAI Realtime, GA protocol (``openai.py``):
  ``session.created``/``session.update``, ``input_audio_buffer.*`` with an energy server VAD
  (or manual commit), ``conversation.item.*``, ``response.*`` with audio + transcript deltas
  (or text deltas), function calls, ``usage``, barge-in, ``response.cancel``, truncation, the
  ``session_expired`` cap, ``error`` for the rest. Shapes as openai-python's ``types/realtime``
  (the tests validate every event sent against them).
- ``/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent``
  (``gemini_url``; ``v1alpha`` too): Gemini Live (``gemini.py``): ``setup``/``setupComplete``,
  ``realtimeInput`` audio with an energy VAD (or ``activityStart``/``activityEnd``),
  ``clientContent``, ``serverContent`` model turns with transcriptions and ``usageMetadata``,
  ``toolCall``/``toolResponse``/``toolCallCancellation``, ``sessionResumptionUpdate`` handles
  that restore the history on a new connection, ``goAway`` then close. camelCase JSON in binary
  frames, as python-genai's ``LiveClientMessage``/``LiveServerMessage``.

The model is a *script* (``session.py``): an ordered list of turns, ``Say("...")``,
``Call("name", {...})`` or both joined with ``+``, consumed one per model response across all
connections, so a replacement connection goes on with the next turn; after calls the model
waits for every output and the next turn is the answer. Past the script it says ``FALLBACK``.
The server cannot understand audio: the test gives the transcript of each user utterance (a
list, or ``transcribe(pcm) -> str``) and may give ``synthesize(text, rate) -> bytes`` (default
``tone``: ``MS_PER_CHAR`` ms a character of loud PCM16, so a VAD hears it).

    async with RealtimeUpstream([Call("get_battery_level"), Say("At 80 percent.")],
                                transcripts=["what is my battery level"]) as upstream:
        ...  # point the gateway at upstream.openai_url or upstream.gemini_url
        await upstream.wait_for(lambda: upstream.function_outputs)

Observable for assertions: ``connections`` (each a ``Connection``: path, headers, every client
event ``received`` and server event ``sent`` in order, ``history``, ``responses``, ``closed``,
``close_code``), ``truncations``, ``function_outputs`` by call id (one entry per answer),
``cancelled_call_ids``, ``outputs_after_cancel``, ``gemini_handles``, ``turns_played``,
``failures`` (exceptions inside the upstream). ``await upstream.wait_for(predicate)`` wakes on
every change, so tests never sleep.

What it does not imitate: understanding; semantic VAD (any turn detection is the energy VAD),
prefix padding, noise reduction, VAD ``threshold`` (``vad_threshold`` is an RMS in PCM16 units);
formats other than PCM16 (no G.711; Gemini input is taken as 16 kHz); images and video;
out-of-band responses and ``response.create`` overrides (recorded, not applied); item
``previous_item_id`` placement, deletion and retrieval; transcription deltas; rate limits;
Gemini context window compression and ``resumable: false`` updates; authentication (headers and
query are recorded, never checked). Token counts are plausible, not billing-exact.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any, Self
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from tests.realtime_upstream.gemini import GeminiSession
from tests.realtime_upstream.openai import SESSION_EXPIRED, OpenAISession
from tests.realtime_upstream.session import (
    FALLBACK,
    JSON,
    Call,
    Connection,
    Say,
    ScriptedCall,
    Turn,
)
from tests.realtime_upstream.vad import MS_PER_CHAR, EnergyVad, VadEvent, rms, tone

__all__ = [
    "FALLBACK",
    "GEMINI_PATH",
    "MS_PER_CHAR",
    "OPENAI_PATH",
    "SESSION_EXPIRED",
    "Call",
    "Connection",
    "EnergyVad",
    "RealtimeUpstream",
    "Say",
    "ScriptedCall",
    "Turn",
    "VadEvent",
    "rms",
    "tone",
]

OPENAI_PATH = "/v1/realtime"
GEMINI_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
GEMINI_PATHS = (GEMINI_PATH, GEMINI_PATH.replace(".v1beta.", ".v1alpha."))

Transcriber = Callable[[bytes], str]
Synthesizer = Callable[[str, int], bytes]


class RealtimeUpstream:
    """The server; ``async with RealtimeUpstream([Say("Hi.")]) as upstream: upstream.openai_url``.

    Knobs: ``realtime`` paces audio at real time in ``chunk_ms`` chunks (False: as fast as
    possible); ``vad_threshold`` is the RMS (PCM16 units) that counts as speech;
    ``max_session_s``/``max_responses`` cap each connection (OpenAI: ``session_expired`` error
    and close; Gemini: close 1008); ``goaway_after_responses``/``goaway_after_s`` send Gemini's
    ``goAway`` with ``goaway_time_left_s`` then close; ``cancel_calls_on_barge_in`` makes Gemini
    cancel outstanding calls when the user speaks; ``gemini_binary_frames`` sends Gemini's JSON
    in binary frames like the real service (False: text frames).
    """

    def __init__(
        self,
        script: Sequence[Turn] = (),
        *,
        transcripts: Sequence[str] | Transcriber = (),
        synthesize: Synthesizer = tone,
        fallback: Turn = FALLBACK,
        realtime: bool = False,
        chunk_ms: int = 100,
        vad_threshold: float = 500.0,
        max_session_s: float | None = None,
        max_responses: int | None = None,
        goaway_after_responses: int | None = None,
        goaway_after_s: float | None = None,
        goaway_time_left_s: float = 1.0,
        cancel_calls_on_barge_in: bool = True,
        gemini_binary_frames: bool = True,
    ) -> None:
        self.script = list(script)
        self.fallback = fallback
        self.synthesize = synthesize
        self.realtime, self.chunk_ms, self.vad_threshold = realtime, chunk_ms, vad_threshold
        self.max_session_s, self.max_responses = max_session_s, max_responses
        self.goaway_after_responses, self.goaway_after_s = goaway_after_responses, goaway_after_s
        self.goaway_time_left_s = goaway_time_left_s
        self.cancel_calls_on_barge_in = cancel_calls_on_barge_in
        self.gemini_binary_frames = gemini_binary_frames
        self._transcribe: Transcriber = (
            transcripts if callable(transcripts) else self._listed(list(transcripts))
        )

        self.connections: list[Connection] = []
        self.turns_played = 0
        self.truncations: list[JSON] = []
        """Every ``conversation.item.truncate`` received (OpenAI)."""
        self.function_outputs: dict[str, list[Any]] = {}
        """Outputs received by call id, in order: one entry per answer."""
        self.cancelled_call_ids: set[str] = set()
        self.outputs_after_cancel: dict[str, list[Any]] = {}
        """Outputs received for calls the upstream had cancelled."""
        self.gemini_handles: dict[str, list[JSON]] = {}
        """Resumption handle -> the Gemini history it restores."""
        self.failures: list[Exception] = []
        """Exceptions in the upstream itself (a test can assert there are none)."""
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._server: Server | None = None

    # The server's life

    async def __aenter__(self) -> Self:
        self._server = await serve(
            self._handle, "127.0.0.1", 0, process_request=self._route, max_size=None
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None, "use the upstream as an async context manager"
        return int(next(iter(self._server.sockets)).getsockname()[1])

    @property
    def openai_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{OPENAI_PATH}"

    @property
    def gemini_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{GEMINI_PATH}"

    # Assertions

    async def wait_for(self, predicate: Callable[[], object], within: float = 5.0) -> None:
        """Wait until ``predicate()`` is true; it is checked again after every change."""
        async with asyncio.timeout(within):
            while not predicate():
                await self._changed.wait()

    def received(self, kind: str) -> list[JSON]:
        """Client events of one kind over all connections."""
        return [e for c in self.connections for e in c.received_of(kind)]

    # For the protocol sessions

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):06d}"

    def next_turn(self) -> Turn:
        self.turns_played += 1
        return self.script.pop(0) if self.script else self.fallback

    def transcribe(self, pcm: bytes) -> str:
        return self._transcribe(pcm)

    def record_output(self, call_id: str, output: Any) -> None:
        self.function_outputs.setdefault(call_id, []).append(output)
        if call_id in self.cancelled_call_ids:
            self.outputs_after_cancel.setdefault(call_id, []).append(output)
        self.notify()

    @staticmethod
    def _listed(transcripts: list[str]) -> Transcriber:
        return lambda _pcm: transcripts.pop(0) if transcripts else ""

    def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        if urlsplit(request.path).path in (OPENAI_PATH, *GEMINI_PATHS):
            return None
        return connection.respond(HTTPStatus.NOT_FOUND, "no such realtime endpoint\n")

    async def _handle(self, ws: ServerConnection) -> None:
        path = ws.request.path if ws.request else ""
        is_openai = urlsplit(path).path == OPENAI_PATH
        headers = dict(ws.request.headers.raw_items()) if ws.request else {}
        conn = Connection("openai" if is_openai else "gemini", path, headers)
        self.connections.append(conn)
        self.notify()
        session = OpenAISession(self, ws, conn) if is_openai else GeminiSession(self, ws, conn)
        try:
            await session.run()
        except Exception as failure:
            self.failures.append(failure)
            raise
        finally:
            await session.stop_tasks()
            conn.closed, conn.close_code = True, ws.close_code
            self.notify()

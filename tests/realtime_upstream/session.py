"""What both protocols share: the script, the record of a connection, the session base."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from tests.realtime_upstream.vad import OUTPUT_RATE

if TYPE_CHECKING:
    from tests.realtime_upstream import RealtimeUpstream

JSON = dict[str, Any]
Protocol = Literal["openai", "gemini"]

# --- The script ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    arguments: JSON
    call_id: str | None = None
    """Fixed id for assertions; by default the server makes one up."""


@dataclass(frozen=True)
class Turn:
    """One model response: words to say (if any), then function calls (if any).

    After calls the model waits for their outputs; the next turn is the answer after them.
    ``cancel_calls`` makes the upstream withdraw the calls right away (Gemini
    ``toolCallCancellation``; OpenAI: the response ends ``cancelled``, its calls incomplete).
    """

    text: str = ""
    calls: tuple[ScriptedCall, ...] = ()
    cancel_calls: bool = False

    def __add__(self, other: Turn) -> Turn:
        return Turn(
            text=" ".join(t for t in (self.text, other.text) if t),
            calls=self.calls + other.calls,
            cancel_calls=self.cancel_calls or other.cancel_calls,
        )


def Say(text: str) -> Turn:
    return Turn(text=text)


FALLBACK = Say("I have nothing more to say.")
"""What the model says once the script is exhausted."""


def Call(
    name: str, arguments: JSON | None = None, *, call_id: str | None = None, cancel: bool = False
) -> Turn:
    return Turn(calls=(ScriptedCall(name, arguments or {}, call_id),), cancel_calls=cancel)


# --- Observability ------------------------------------------------------------------------


@dataclass
class Connection:
    """One client connection, as the upstream saw it."""

    protocol: Protocol
    path: str
    headers: dict[str, str]
    received: list[JSON] = field(default_factory=list)
    """Every client event, parsed, in order."""
    sent: list[JSON] = field(default_factory=list)
    """Every server event, in order."""
    history: list[JSON] = field(default_factory=list)
    """The conversation: OpenAI items, or Gemini contents (restored on resumption)."""
    responses: int = 0
    """Model responses (script turns) played on this connection."""
    closed: bool = False
    close_code: int | None = None

    def received_of(self, kind: str) -> list[JSON]:
        """Client events of one OpenAI ``type`` or one Gemini top-level key."""
        return [e for e in self.received if is_kind(e, kind)]

    def sent_of(self, kind: str) -> list[JSON]:
        """Server events of one OpenAI ``type`` or one Gemini top-level key."""
        return [e for e in self.sent if is_kind(e, kind)]


def is_kind(event: JSON, kind: str) -> bool:
    return bool(event["type"] == kind) if "type" in event else kind in event


# --- What both protocols share ------------------------------------------------------------


@dataclass
class ModelOutput:
    """A model response being played; ``interrupt()`` stops it between two chunks."""

    id: str
    turn: Turn
    task: asyncio.Task[None] | None = None
    reason: str | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def interrupt(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.stopped.set()


class RealtimeSession:
    """A connection's reader loop, sending, pacing and timers."""

    def __init__(self, upstream: RealtimeUpstream, ws: ServerConnection, conn: Connection) -> None:
        self.up, self.ws, self.conn = upstream, ws, conn
        self.output: ModelOutput | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.on_open()
            async for raw in self.ws:
                try:
                    message = json.loads(raw)
                except ValueError:
                    message = None
                if not isinstance(message, dict):
                    await self.on_invalid(repr(raw[:80]))
                    continue
                self.conn.received.append(message)
                self.up.notify()
                await self.on_message(message)

    async def on_open(self) -> None:
        """The connection is up (Gemini: before its ``setup``)."""

    def start_timers(self) -> None:
        """The session began: its time cap runs from now."""
        if self.up.max_session_s is not None:
            self.spawn(self._cap_after(self.up.max_session_s))

    async def on_message(self, message: JSON) -> None:
        raise NotImplementedError

    async def on_invalid(self, raw: str) -> None:
        raise NotImplementedError

    async def expire(self) -> None:
        """The session cap: end the connection as the provider does."""
        raise NotImplementedError

    async def send(self, message: JSON) -> None:
        await self.send_frame(json.dumps(message))

    async def send_frame(self, frame: str | bytes) -> None:
        """Send one JSON frame, recording a copy: later changes to an item never rewrite it."""
        self.conn.sent.append(json.loads(frame))
        self.up.notify()
        await self.ws.send(frame)

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code, reason)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(self._quietly(coroutine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop_tasks(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def start_output(
        self, turn: Turn, play: Callable[[ModelOutput], Coroutine[Any, Any, None]]
    ) -> ModelOutput:
        output = ModelOutput(self.up.new_id("resp"), turn)
        self.output = output
        output.task = self.spawn(play(output))
        return output

    async def pace(self, output: ModelOutput, chunk_ms: int) -> None:
        """Real-time pacing between chunks, cut short by an interruption."""
        if self.up.realtime:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(output.stopped.wait(), chunk_ms / 1000)
        else:
            await asyncio.sleep(0)  # let the reader see a barge-in between chunks

    def chunks(self, text: str, pcm: bytes) -> list[tuple[str, bytes]]:
        """Split an answer into ~``chunk_ms`` audio chunks, each with its share of the text."""
        if not pcm:  # text only: a delta a word
            return [(word, b"") for word in re.findall(r"\s*\S+", text)] or [(text, b"")]
        size = OUTPUT_RATE * self.up.chunk_ms // 1000 * 2
        count = max(1, math.ceil(len(pcm) / size))
        return [
            (
                text[len(text) * i // count : len(text) * (i + 1) // count],
                pcm[i * size : (i + 1) * size],
            )
            for i in range(count)
        ]

    def count_response(self) -> bool:
        """Count a played turn; True when the per-connection cap is reached."""
        self.conn.responses += 1
        self.up.notify()
        cap = self.up.max_responses
        return cap is not None and self.conn.responses >= cap

    async def _cap_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.expire()

    async def _quietly(self, coroutine: Coroutine[Any, Any, None]) -> None:
        try:
            await coroutine
        except ConnectionClosed:
            pass
        except Exception as failure:  # a bug here: recorded for the test, the socket closed
            self.up.failures.append(failure)
            self.up.notify()
            await self.close(1011, f"upstream failure: {failure!r}"[:120])


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def deep_merge(base: JSON, update: JSON) -> JSON:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged

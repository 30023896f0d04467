"""A hand-written model server for what llmock cannot send: exact bytes, on a free port.

Each request takes the next scripted ``Answer`` (the last one repeats): a status, a content
type and body pieces sent one by one, where a piece may be a pause (``Pause``) or ``HANG``
(send nothing more until the client goes away). The server records every request with the
client's port, so a test can count the connections the gateway opened.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.mock_llm import asgi_server

__all__ = ["HANG", "Answer", "Pause", "RawLLM", "Seen", "raw_llm", "sse"]


@dataclass(frozen=True)
class Pause:
    """Send nothing for ``seconds`` (or until the client goes away)."""

    seconds: float


HANG = Pause(3600.0)
"""Send nothing more, until the client gives up."""


@dataclass(frozen=True)
class Answer:
    """One scripted answer. ``headers=False`` never sends even the status line."""

    pieces: tuple[bytes | Pause, ...] = ()
    status: int = 200
    content_type: str = "text/event-stream"
    headers: bool = True


@dataclass
class Seen:
    """A request the server got."""

    path: str
    client_port: int
    headers: dict[str, str]
    body: Any
    started_at: float
    ended_at: float | None = None


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; ``data`` is JSON-encoded unless it is already text.

    Lone surrogates go out as ``\\udXXX`` escapes, as a JavaScript server sends them.
    """
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {payload}\n\n".encode()


@dataclass
class RawLLM:
    url: str
    answers: list[Answer] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def script(self, *answers: Answer) -> None:
        self.answers[:] = answers

    def ports(self) -> set[int]:
        """The client ports requests came from: one per connection."""
        return {s.client_port for s in self.seen}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen = Seen(
            path=scope["path"],
            client_port=scope["client"][1],
            headers={k.decode(): v.decode() for k, v in scope["headers"]},
            body=json.loads(raw) if raw else None,
            started_at=time.monotonic(),
        )
        self.seen.append(seen)
        gone = asyncio.ensure_future(receive())  # http.disconnect when the client leaves
        try:
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
            if not answer.headers:
                await asyncio.wait([gone], timeout=HANG.seconds)
                return
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status,
                    "headers": [(b"content-type", answer.content_type.encode())],
                }
            )
            for piece in answer.pieces:
                if isinstance(piece, Pause):
                    await asyncio.wait([gone], timeout=piece.seconds)
                    if gone.done():
                        return
                else:
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            gone.cancel()
            seen.ended_at = time.monotonic()


@asynccontextmanager
async def raw_llm(*answers: Answer) -> AsyncIterator[RawLLM]:
    """The server, in this event loop, on a free port."""
    llm = RawLLM(url="", answers=list(answers))
    async with asgi_server(llm) as llm.url:
        yield llm

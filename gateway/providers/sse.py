"""Server-sent events from the bytes of a response, as they arrive.

The decoder is fed whatever the network hands over (a read may end in the middle of a line,
of a UTF-8 sequence or between ``\\r`` and ``\\n``) and gives back the events completed so
far. Only ``event:`` and ``data:`` fields matter to the model APIs; comments (``:``) and
other fields are skipped. The data stays bytes: the providers decode its JSON from them, so
no text is made of it on the way (a sequence cut between two reads is whole by then).

Most events are one ``data:`` line (OpenAI's, Gemini's), or an ``event:`` line and one
``data:`` line (Anthropic's): one slice of the read, and no line objects; the others
(several data lines, comments, other fields) go line by line.
"""

from __future__ import annotations

import msgspec

from gateway.errors import ProviderError

__all__ = ["MAX_EVENT_BYTES", "SseDecoder", "SseEvent"]

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The longest event taken: a server that never ends one fails the step, not the gateway."""


class SseEvent(msgspec.Struct, frozen=True):
    """One event: its type (``message`` unless named) and its data lines joined."""

    event: str
    data: bytes


class SseDecoder:
    """Turns a stream of byte chunks into ``SseEvent``s (see the module docstring)."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""
        """Bytes after the last whole event (with a CR last, its LF may come next)."""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events that ``chunk`` completes."""
        if self._rest:
            chunk = self._rest + chunk
        if b"\r" in chunk:
            chunk = _lf_lines(chunk, final=False)
        events: list[SseEvent] = []
        start = 0
        while (end := chunk.find(b"\n\n", start)) >= 0:
            line = chunk.find(b"\n", start, end)
            if line < 0 and chunk.startswith(b"data: ", start):
                events.append(SseEvent("message", chunk[start + 6 : end]))  # OpenAI, Gemini
            elif (
                line >= 0
                and chunk.startswith(b"event: ", start)
                and chunk.startswith(b"data: ", line + 1)
                and chunk.find(b"\n", line + 1, end) < 0
            ):  # Anthropic: a named event of one data line
                name = chunk[start + 7 : line].strip().decode("utf-8", "replace")
                events.append(SseEvent(name, chunk[line + 7 : end]))
            else:
                _block(chunk[start:end], events)
            start = end + 2
        rest = chunk[start:] if start else chunk
        if len(rest) > MAX_EVENT_BYTES:
            raise ProviderError(f"sent an event longer than {MAX_EVENT_BYTES} bytes")
        self._rest = rest
        return events

    def close(self) -> list[SseEvent]:
        """The events left when the stream ends (one not followed by a blank line too)."""
        rest, self._rest = self._rest, b""
        if b"\r" in rest:
            rest = _lf_lines(rest, final=True)
        events: list[SseEvent] = []
        if rest:
            _block(rest, events)
        return events


def _lf_lines(chunk: bytes, *, final: bool) -> bytes:
    """Lines ending in CRLF or CR made to end in LF; a CR last is kept for the next read
    (its LF may follow) unless the stream has ended."""
    if chunk.endswith(b"\r") and not final:
        return _lf_lines(chunk[:-1], final=True) + b"\r"
    return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _block(block: bytes, events: list[SseEvent]) -> None:
    """The events of lines with no blank line inside but at event ends (the last ends one)."""
    kind = ""
    data: list[bytes] = []
    for line in [*block.split(b"\n"), b""]:
        if not line:
            if data:
                events.append(SseEvent(kind or "message", b"\n".join(data)))
            kind, data = "", []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
        elif line.startswith(b"event:"):
            kind = line[6:].strip().decode("utf-8", "replace")

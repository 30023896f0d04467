"""Server-sent events from the bytes of a response, as they arrive.

The decoder is fed whatever the network hands over (a read may end in the middle of a line,
of a UTF-8 sequence or between ``\\r`` and ``\\n``) and gives back the events completed so
far. Only ``event:`` and ``data:`` fields matter to the model APIs; comments (``:``) and
other fields are skipped.
"""

from __future__ import annotations

import codecs

import msgspec

__all__ = ["SseDecoder", "SseEvent"]


class SseEvent(msgspec.Struct, frozen=True):
    """One event: its type (``message`` unless named) and its data lines joined."""

    event: str
    data: str


class SseDecoder:
    """Turns a stream of byte chunks into ``SseEvent``s (see the module docstring)."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")("replace")
        self._line = ""
        """The start of a line whose end has not come yet."""
        self._after_cr = False
        """The last line ended in CR: a LF first in the next chunk belongs to it."""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events that ``chunk`` completes."""
        return self._lines(self._text.decode(chunk))

    def close(self) -> list[SseEvent]:
        """The events left when the stream ends (one not followed by a blank line too)."""
        events = self._lines(self._text.decode(b"", final=True))
        if self._line:
            events += self._lines("\n")
        if self._data:
            events.append(SseEvent(self._event or "message", "\n".join(self._data)))
            self._event, self._data = "", []
        return events

    def _lines(self, text: str) -> list[SseEvent]:
        if not text:
            return []
        if self._after_cr and text.startswith("\n"):  # the second half of a CRLF
            text = text[1:]
        self._after_cr = False
        if "\r" in text:  # a line may end in CRLF, LF or CR
            self._after_cr = text.endswith("\r")
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        *lines, self._line = (self._line + text).split("\n")
        events: list[SseEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(SseEvent(self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
            elif line.startswith("event:"):
                self._event = line[6:].strip()
        return events

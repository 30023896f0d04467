"""Server-sent events from bytes cut anywhere: mid-line, mid-character, mid-CRLF."""

from __future__ import annotations

import pytest

from gateway.errors import ProviderError
from gateway.providers.sse import MAX_EVENT_BYTES, SseDecoder, SseEvent


def decode(*chunks: bytes) -> list[SseEvent]:
    decoder = SseDecoder()
    return [e for chunk in chunks for e in decoder.feed(chunk)] + decoder.close()


def test_events_cut_at_every_byte_come_out_whole():
    body = 'event: delta\ndata: {"text": "é😀"}\n\n: a comment\ndata: a\ndata: b\n\n'.encode()
    expected = [
        SseEvent("delta", '{"text": "é😀"}'.encode()),
        SseEvent("message", b"a\nb"),
    ]
    assert decode(body) == expected
    assert decode(*(body[i : i + 1] for i in range(len(body)))) == expected


def test_lines_may_end_in_crlf_or_cr_even_when_cut_between_them():
    assert decode(b"data: x\r", b"\n\r\ndata: y\r\r") == [
        SseEvent("message", b"x"),
        SseEvent("message", b"y"),
    ]
    assert decode(b"data: x\r", b"\r") == [SseEvent("message", b"x")]


def test_an_event_without_its_blank_line_is_kept_at_the_end():
    assert decode(b"data: [DONE]") == [SseEvent("message", b"[DONE]")]
    assert decode(b"") == []


def test_one_line_events_many_to_a_read_and_blank_lines_anywhere():
    body = b"\ndata: 1\n\ndata:2\n\n\n\ndata: 3\n\ndata: 4"
    expected = [SseEvent("message", d) for d in (b"1", b"2", b"3", b"4")]
    assert decode(body) == expected
    assert decode(*(body[i : i + 3] for i in range(0, len(body), 3))) == expected


def test_an_event_that_never_ends_fails_the_step_not_the_gateway():
    decoder = SseDecoder()
    decoder.feed(b"data: " + b"x" * (MAX_EVENT_BYTES - 6))
    with pytest.raises(ProviderError, match="longer than"):
        decoder.feed(b"xx")


def test_named_events_of_one_data_line_and_their_neighbours():
    body = (
        b"data: a\n\nevent: only a name\n\nevent: ping\ndata: {}\n\nevent: x\ndata: 1\ndata: 2\n\n"
    )
    expected = [SseEvent("message", b"a"), SseEvent("ping", b"{}"), SseEvent("x", b"1\n2")]
    assert decode(body) == expected
    assert decode(*(body[i : i + 5] for i in range(0, len(body), 5))) == expected

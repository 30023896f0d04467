"""Server-sent events from bytes cut anywhere: mid-line, mid-character, mid-CRLF."""

from __future__ import annotations

from gateway.providers.sse import SseDecoder, SseEvent


def decode(*chunks: bytes) -> list[SseEvent]:
    decoder = SseDecoder()
    return [e for chunk in chunks for e in decoder.feed(chunk)] + decoder.close()


def test_events_cut_at_every_byte_come_out_whole():
    body = 'event: delta\ndata: {"text": "é😀"}\n\n: a comment\ndata: a\ndata: b\n\n'.encode()
    expected = [SseEvent("delta", '{"text": "é😀"}'), SseEvent("message", "a\nb")]
    assert decode(body) == expected
    assert decode(*(body[i : i + 1] for i in range(len(body)))) == expected


def test_lines_may_end_in_crlf_or_cr_even_when_cut_between_them():
    assert decode(b"data: x\r", b"\n\r\ndata: y\r\r") == [
        SseEvent("message", "x"),
        SseEvent("message", "y"),
    ]
    assert decode(b"data: x\r", b"\r") == [SseEvent("message", "x")]


def test_an_event_without_its_blank_line_is_kept_at_the_end():
    assert decode(b"data: [DONE]") == [SseEvent("message", "[DONE]")]
    assert decode(b"") == []

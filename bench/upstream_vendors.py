"""A cheap model server speaking Anthropic's Messages and Gemini's streamGenerateContent SSE.

    python bench/upstream_vendors.py --port P [--pace 0.05] [--host 127.0.0.1] [--lifetime 3600]

The upstream of the harness targets ``gateway-anthropic`` and ``gateway-gemini``
(``bench/targets_vendors.json``), as ``.bench/servers/upstream_openai.py`` is that of
``gateway-openai``: it stands in for the vendor while costing as little CPU per chunk as it
can, so that what the harness measures is the gateway reading it. A bare asyncio (uvloop)
Protocol speaking HTTP/1.1 with keep-alive, no framework: each stream's events are encoded
once, one SSE event goes out per HTTP chunk, and one loop timer per millisecond slot serves
every paced stream due in it.

  POST /v1/messages   Anthropic, ``"stream": true``: ``message_start``,
      ``content_block_start`` (text), ``ping``, one ``content_block_delta`` (``text_delta``)
      per word, ``content_block_stop``, ``message_delta`` (``stop_reason: end_turn`` and
      usage), ``message_stop``; each as ``event: <type>`` + ``data: <json>``.
  POST /v1beta/models/{model}:streamGenerateContent?alt=sse   Gemini: one
      ``GenerateContentResponse`` per word (``candidates[0].content.parts[0].text``), then a
      last one with ``finishReason: STOP`` and the whole ``usageMetadata``.

The text of the last user message picks the answer: ``stream N`` is N one-word deltas
(``"word "``) --pace seconds apart, ``fanout N`` N of them as fast as the client reads them
(written in batches while the transport is not paused), anything else a short sentence at
once. Anything else (other paths, ``stream: false``, JSON that is not an object) gets the
vendor's error object. N is at most --max-chunks, a request head 64 KiB, a body --max-body;
the process exits after --lifetime seconds (SIGTERM or SIGINT stop it at once).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, cast

import msgspec
import uvloop

QUANTUM = 0.001
"""Width of a timer slot, s: the paced deltas due in one slot go out on one timer."""
FANOUT_BATCH = 64
"""Deltas a fan-out stream writes per transport.write() while the socket takes them."""
SHORT_ANSWER = "This is the benchmark upstream answering."
WORD = "word "
MAX_HEAD = 64 * 1024
GEMINI_PREFIX = "/v1beta/models/"
GEMINI_SUFFIX = ":streamGenerateContent"

_encode = msgspec.json.encode
_decode = msgspec.json.decode


def http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


LAST_CHUNK = b"0\r\n\r\n"


class Stats:
    requests: ClassVar[int] = 0
    streams: ClassVar[int] = 0
    deltas: ClassVar[int] = 0
    open_conns: ClassVar[int] = 0
    max_open: ClassVar[int] = 0
    active: ClassVar[int] = 0
    max_active: ClassVar[int] = 0


class BadRequest(Exception):
    """A request answered with the vendor's error object (400 unless said otherwise)."""

    def __init__(self, message: str, status: str = "400 Bad Request") -> None:
        super().__init__(message)
        self.status = status


# -- what the request asks --------------------------------------------------------------


def text_of(parts: Any) -> str:
    """The last text of a list of content blocks or parts (``{"text": ...}``), or a string."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        for part in reversed(parts):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                return str(part["text"])
    return ""


def last_user_text(turns: Any, content_key: str) -> str:
    """The text of the last user turn (Anthropic ``messages``/``content``, Gemini
    ``contents``/``parts``)."""
    if isinstance(turns, list):
        for turn in reversed(turns):
            if isinstance(turn, dict) and turn.get("role") == "user":
                return text_of(turn.get(content_key)).strip()
    return ""


def prompt_tokens(body_size: int) -> int:
    """A rough token count of a request body (4 bytes a token), for the usage figures."""
    return body_size // 4 + 1


def answer_words(text: str, pace: float, max_chunks: int) -> tuple[list[str], float]:
    """The words to send and their pace (0: all at once)."""
    parts = text.split()
    if len(parts) == 2 and parts[0] in ("stream", "fanout") and parts[1].isdigit():
        n = min(int(parts[1]), max_chunks)
        return [WORD] * n, (pace if parts[0] == "stream" else 0.0)
    return [w + " " for w in SHORT_ANSWER.split()], 0.0


# -- the vendors' streams ---------------------------------------------------------------


class Script(NamedTuple):
    """One answer's bytes: the opening events, the event of each word, the closing ones."""

    opening: bytes
    delta: Callable[[str], bytes]
    closing: Callable[[int], bytes]


def anthropic_event(kind: str, data: dict[str, Any]) -> bytes:
    return http_chunk(b"event: %s\ndata: %s\n\n" % (kind.encode(), _encode(data)))


_ANTHROPIC_WORD = anthropic_event(
    "content_block_delta",
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": WORD}},
)


def anthropic_script(body: dict[str, Any], prompt: int, seq: int) -> Script:
    if body.get("stream") is not True:
        raise BadRequest("this bench server only streams: send stream: true")
    model = str(body.get("model") or "bench")
    start = {
        "type": "message_start",
        "message": {
            "id": f"msg_bench{os.getpid():x}{seq:010d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 1},
        },
    }
    opening = (
        anthropic_event("message_start", start)
        + anthropic_event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        + anthropic_event("ping", {"type": "ping"})
    )

    def delta(word: str) -> bytes:
        if word == WORD:
            return _ANTHROPIC_WORD
        data = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": word},
        }
        return anthropic_event("content_block_delta", data)

    def closing(words: int) -> bytes:
        stop = {"stop_reason": "end_turn", "stop_sequence": None}
        return (
            anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + anthropic_event(
                "message_delta",
                {"type": "message_delta", "delta": stop, "usage": {"output_tokens": words}},
            )
            + anthropic_event("message_stop", {"type": "message_stop"})
            + LAST_CHUNK
        )

    return Script(opening, delta, closing)


def gemini_script(model: str, prompt: int, seq: int) -> Script:
    response_id = f"bench{os.getpid():x}{seq:010d}"

    def chunk(text: str, usage: dict[str, int], last: bool = False) -> bytes:
        candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}}
        if last:
            candidate["finishReason"] = "STOP"
        candidate["index"] = 0
        data = {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": response_id,
        }
        # CRLF CRLF ends an event, as Gemini's server sends them (its SDKs accept LF LF too)
        return http_chunk(b"data: " + _encode(data) + b"\r\n\r\n")

    so_far = {"promptTokenCount": prompt, "totalTokenCount": prompt}
    word_chunk = chunk(WORD, so_far)

    def delta(word: str) -> bytes:
        return word_chunk if word == WORD else chunk(word, so_far)

    def closing(words: int) -> bytes:
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": words,
            "totalTokenCount": prompt + words,
        }
        return chunk("", usage, last=True) + LAST_CHUNK

    return Script(b"", delta, closing)


# -- paced and fanned-out streams -------------------------------------------------------


class Scheduler:
    """Paced streams, bucketed by the millisecond slot of their next delta: one loop timer
    per slot that has any stream due, whatever the number of streams."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buckets: dict[int, list[Stream]] = {}

    def add(self, stream: Stream, due: float) -> None:
        slot = math.ceil(due / QUANTUM)
        bucket = self.buckets.get(slot)
        if bucket is None:
            self.buckets[slot] = [stream]
            self.loop.call_at(slot * QUANTUM, self.fire, slot)
        else:
            bucket.append(stream)

    def fire(self, slot: int) -> None:
        now = max(self.loop.time(), slot * QUANTUM)
        for stream in self.buckets.pop(slot, ()):
            stream.tick(now)


class Stream:
    """One answer of N equal deltas on one connection, and how far it has got."""

    __slots__ = ("conn", "dead", "n", "pace", "sent", "t0", "tail", "word")

    def __init__(self, conn: HttpConn, word: bytes, tail: bytes, n: int, pace: float) -> None:
        self.conn, self.word, self.tail, self.n, self.pace = conn, word, tail, n, pace
        self.t0 = conn.server.loop.time()
        self.sent = 0
        self.dead = False

    def tick(self, now: float) -> None:
        """Paced: write every delta due by now (more than one only if the loop fell behind)."""
        if self.dead:
            return
        due = min(self.n, int((now - self.t0) / self.pace + 1e-9) + 1)
        m = max(1, due - self.sent)
        self.sent += m
        Stats.deltas += m
        if self.sent >= self.n:
            self.conn.write(self.word * m + self.tail)
            self.conn.finished(self)
        else:
            self.conn.write(self.word * m)
            self.conn.server.scheduler.add(self, self.t0 + self.sent * self.pace)

    def pump(self) -> None:
        """Fan-out: write batches while the transport takes them (again on resume_writing)."""
        conn = self.conn
        for _ in range(self.n // FANOUT_BATCH + 2):  # bounded: each pass writes a batch or ends
            if self.dead or conn.paused:
                return
            m = min(FANOUT_BATCH, self.n - self.sent)
            if m <= 0:
                conn.write(self.tail)
                conn.finished(self)
                return
            self.sent += m
            Stats.deltas += m
            conn.write(self.word * m)


# -- HTTP/1.1 ---------------------------------------------------------------------------


class Server:
    def __init__(self, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
        self.pace: float = args.pace
        self.max_chunks: int = args.max_chunks
        self.max_body: int = args.max_body
        self.loop = loop
        self.scheduler = Scheduler(loop)
        self.seq = 0


class HttpConn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy: Stream | None = None  # an answer in progress: later requests wait for it
        self.paused = False
        self.closing = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        Stats.open_conns += 1
        Stats.max_open = max(Stats.max_open, Stats.open_conns)

    def connection_lost(self, exc: Exception | None) -> None:
        Stats.open_conns -= 1
        self.closing = True
        if self.busy is not None:
            self.busy.dead = True
            self.busy = None
            Stats.active -= 1

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.busy is not None and self.busy.pace == 0:
            self.busy.pump()

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if self.busy is None:
            self.parse()

    def write(self, data: bytes) -> None:
        if not self.closing and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def finished(self, stream: Stream) -> None:
        if self.busy is stream:
            self.busy = None
            Stats.active -= 1
        if self.close_after:
            self.close()
        elif self.buf and not self.closing:
            self.parse()

    def head(self, status: str, ctype: bytes, length: int | None, extra: bytes = b"") -> bytes:
        """A response head: ``length`` None for a chunked body; ``extra``, header lines."""
        framing = (
            b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked"
        )
        close = b"connection: close\r\n" if self.close_after else b""
        return b"HTTP/1.1 %s\r\ncontent-type: %s\r\n%s\r\n%s%s\r\n" % (
            status.encode(),
            ctype,
            framing,
            extra,
            close,
        )

    def reply(self, status: str, body: bytes) -> None:
        self.write(self.head(status, b"application/json", len(body)) + body)

    def parse(self) -> None:
        for _ in range(64):  # requests handled per read, at most (keep-alive, pipelined)
            if self.busy is not None or self.closing:
                return
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    self.close_after = True
                    self.reply("431 Request Header Fields Too Large", b"")
                    self.close()
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            request_line = lines[0].split(" ")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            try:
                length = int(headers.get("content-length") or 0)
            except ValueError:
                length = -1
            if (
                len(request_line) != 3
                or length < 0
                or length > self.server.max_body
                or ("chunked" in headers.get("transfer-encoding", "").lower())
            ):  # a bad head, or a body this server does not frame: the connection cannot go on
                self.close_after = True
                self.reply("400 Bad Request", b'{"error":"bad request head or body length"}')
                self.close()
                return
            if len(self.buf) < end + 4 + length:
                return  # wait for the whole body
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, target, version = request_line
            connection = headers.get("connection", "").lower()
            self.close_after = connection == "close" or (
                version == "HTTP/1.0" and connection != "keep-alive"
            )
            Stats.requests += 1
            self.handle(method, target, body)
            if self.close_after and self.busy is None:
                self.close()
                return

    def handle(self, method: str, target: str, body: bytes) -> None:
        path, _, query = target.partition("?")
        gemini = path.startswith(GEMINI_PREFIX)
        try:
            if method != "POST":
                raise BadRequest("use POST", "405 Method Not Allowed")
            if path != "/v1/messages" and not (gemini and path.endswith(GEMINI_SUFFIX)):
                raise BadRequest(f"no route {method} {path}", "404 Not Found")
            try:
                request = _decode(body)
            except msgspec.DecodeError:
                request = None
            if not isinstance(request, dict):
                raise BadRequest("the body is not a JSON object")
            self.server.seq += 1
            if gemini:
                if "alt=sse" not in query.split("&"):
                    raise BadRequest("this bench server streams with alt=sse only")
                model = path[len(GEMINI_PREFIX) : -len(GEMINI_SUFFIX)]
                script = gemini_script(model, prompt_tokens(len(body)), self.server.seq)
                text = last_user_text(request.get("contents"), "parts")
            else:
                script = anthropic_script(request, prompt_tokens(len(body)), self.server.seq)
                text = last_user_text(request.get("messages"), "content")
        except BadRequest as exc:
            self.reply(exc.status, error_body(gemini, exc.status, str(exc)))
            return
        self.stream(script, text)

    def stream(self, script: Script, text: str) -> None:
        server = self.server
        words, pace = answer_words(text, server.pace, server.max_chunks)
        sse = b"text/event-stream; charset=utf-8"
        head = self.head("200 OK", sse, None, b"cache-control: no-cache\r\n")
        Stats.streams += 1
        tail = script.closing(len(words))
        if len(set(words)) != 1:  # the short answer: every word at once
            Stats.deltas += len(words)
            self.write(head + script.opening + b"".join(map(script.delta, words)) + tail)
            return  # parse() closes the connection or goes on with the next request
        stream = Stream(self, script.delta(words[0]), tail, len(words), pace)
        self.busy = stream
        Stats.active += 1
        Stats.max_active = max(Stats.max_active, Stats.active)
        self.write(head + script.opening)
        if pace > 0:
            stream.tick(stream.t0)  # the first word now, word k at t0 + k * pace
        else:
            stream.pump()


def error_body(gemini: bool, status: str, message: str) -> bytes:
    code = int(status.split(" ", 1)[0])
    if gemini:
        kind = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}.get(code, "FAILED_PRECONDITION")
        return _encode({"error": {"code": code, "message": message, "status": kind}})
    kind = {404: "not_found_error"}.get(code, "invalid_request_error")
    return _encode({"type": "error", "error": {"type": kind, "message": message}})


def raise_nofile(want: int = 1 << 16) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for limit in ((want, want), (max(soft, min(want, hard)), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            return
        except (ValueError, OSError):
            continue


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    state = Server(args, loop)
    server = await loop.create_server(
        lambda: HttpConn(state), args.host, args.port, backlog=4096, reuse_address=True
    )
    stop: asyncio.Future[None] = loop.create_future()

    def request_stop() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop)
    print(
        f"upstream_vendors on http://{args.host}:{args.port} (Anthropic /v1/messages, Gemini "
        f"/v1beta/models/*:streamGenerateContent) pace={args.pace}s pid={os.getpid()}",
        flush=True,
    )
    started = time.monotonic()
    try:
        await asyncio.wait_for(stop, args.lifetime)
    except TimeoutError:
        print(f"upstream_vendors: --lifetime {args.lifetime}s reached, exiting", flush=True)
    server.close()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"upstream_vendors: {Stats.requests} requests, {Stats.streams} streams, "
        f"{Stats.deltas} deltas, max {Stats.max_open} connections / {Stats.max_active} "
        f"streams at once, CPU {cpu.ru_utime + cpu.ru_stime:.2f} s over "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--pace", type=float, default=0.05, help="seconds between the deltas of 'stream N'"
    )
    parser.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many s")
    parser.add_argument("--max-chunks", type=int, default=1_000_000, help="largest N")
    parser.add_argument("--max-body", type=int, default=16 * 2**20, help="largest body, bytes")
    args = parser.parse_args()
    if args.pace <= 0:
        parser.error("--pace must be > 0")
    raise_nofile()
    uvloop.run(serve(args))


if __name__ == "__main__":
    main()

"""Time to the first delta when a model server sends its whole answer in one burst.

A raw HTTP server on a free port answers ``POST /v1/chat/completions`` with an
OpenAI-compatible stream of N chunks written at once (as a fast server, or a proxy that
buffers, delivers them). Measured, on loopback, N rounds each:

- direct: the gateway's own OpenAI adapter reading that server, from the request to its
  first parsed text (what any client reading the server straight would get);
- through the gateway: a real socket to the gateway (in-process, test agent on the
  ``openai`` provider pointed at that server), from sending ``user.message`` to the
  first ``text.delta``.

The difference is what the gateway adds to the first delta. Prints figures; asserts
nothing.

    .venv/bin/python -m bench.first_delta [chunks] [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from bench.provider_overhead import sse_body
from gateway.core.model import ModelRequest, ModelText
from gateway.core.transcript import UserTurn
from gateway.logging import configure_logging
from gateway.providers.http import HttpModel
from gateway.providers.openai import OpenAIProvider
from gateway.wire.v1 import ResponseDone, TextDelta, UserMessage
from tests.support import serving, session

__all__: list[str] = []


_HANDLERS: set[asyncio.Task[Any]] = set()
"""The server's connection handlers: awaited before the loop ends (each ends at EOF)."""


async def _serve(body: bytes) -> tuple[asyncio.Server, str]:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        _HANDLERS.add(task)
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in request.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(head + body)  # the whole answer in one burst
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"


async def _direct(base_url: str, rounds: int) -> list[float]:
    provider = OpenAIProvider(HttpModel(model="m", base_url=base_url))
    request = ModelRequest(instructions="", items=(UserTurn(text="hi"),))
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        first = None
        async for event in provider.stream(request):  # read it all, as the gateway does
            if isinstance(event, ModelText) and first is None:
                first = time.perf_counter() - started
        assert first is not None
        samples.append(first)
    await provider.aclose()
    return samples


async def _through_gateway(base_url: str, rounds: int) -> list[float]:
    samples = []
    async with (
        serving(model="openai:m", base_url=base_url) as gateway,
        session(gateway.url) as (conn, _),
    ):
        for _ in range(rounds):
            started = time.perf_counter()
            await conn.send(UserMessage(text="hi"))
            first = None
            while True:
                event = await conn.recv()
                if isinstance(event, TextDelta) and first is None:
                    first = time.perf_counter() - started
                if isinstance(event, ResponseDone):
                    break
            assert first is not None
            samples.append(first)
    return samples


def _line(name: str, samples: list[float]) -> str:
    samples = sorted(samples)
    p90 = samples[int(len(samples) * 0.9)]
    return f"{name:<22} p50={statistics.median(samples) * 1000:7.2f} ms  p90={p90 * 1000:7.2f} ms"


async def main(chunks: int, rounds: int) -> None:
    server, base_url = await _serve(sse_body(chunks))
    async with server:
        direct = await _direct(base_url, rounds)
        gateway = await _through_gateway(base_url, rounds)
        await asyncio.wait(_HANDLERS - {asyncio.current_task()}, timeout=5)
    print(f"python {sys.version.split()[0]}, {chunks} chunks in one burst, {rounds} rounds")
    print(_line("direct (adapter)", direct))
    print(_line("through the gateway", gateway))


if __name__ == "__main__":
    configure_logging("warning")
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [500, 50][len(args) :])))

"""Per-delta cost of the OpenAI-compatible adapter (its HTTP client and parsing), next to the
official `openai` SDK when it is installed, on the same stream.

Both read one pre-built SSE body of N chunks from a server in the same process on loopback
(it writes the whole answer at once, with its length), so the figure is the client-side
cost of turning the bytes of a socket into text deltas.

    .venv/bin/python -m bench.provider_overhead [chunks]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from gateway.core.model import ModelRequest, ModelText
from gateway.core.transcript import UserTurn
from gateway.providers.http import HttpModel
from gateway.providers.openai import OpenAIProvider

__all__: list[str] = []


def sse_body(chunks: int) -> bytes:
    lines = []
    for i in range(chunks):
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}],
        }
        lines.append(f"data: {json.dumps(chunk)}\n\n")
    done = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    lines.append(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n")
    return "".join(lines).encode()


async def serve(body: bytes) -> asyncio.Server:
    """A server answering every request on its connection with ``body`` (kept alive)."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while request := await reader.readuntil(b"\r\n\r\n"):
                length = 0
                for line in request.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(head + body)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed, or the run is over
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


def base_url(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def ours(url: str) -> int:
    provider = OpenAIProvider(HttpModel(model="m", base_url=url))
    request = ModelRequest(instructions="", items=(UserTurn(text="hi"),))
    try:
        return sum([1 async for e in provider.stream(request) if isinstance(e, ModelText)])
    finally:
        await provider.aclose()


async def sdk(url: str) -> int:
    import openai  # type: ignore[import-not-found, unused-ignore]  # optional, often absent

    client = openai.AsyncOpenAI(api_key="x", base_url=url)
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    return sum([1 async for chunk in stream if chunk.choices and chunk.choices[0].delta.content])


async def per_delta(
    run: Callable[[str], Awaitable[int]], url: str, chunks: int, rounds: int = 7
) -> list[float]:
    await run(url)  # warm up
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        assert await run(url) == chunks
        samples.append((time.perf_counter() - started) / chunks * 1e6)
    return samples


async def main(chunks: int) -> None:
    server = await serve(sse_body(chunks))
    url = base_url(server)
    print(f"python {sys.version.split()[0]}, {chunks} chunks, median of 7 rounds, loopback")
    mine = await per_delta(ours, url, chunks)
    print(f"gateway adapter (own HTTP + SSE): {statistics.median(mine):6.2f} µs per delta")
    try:
        import openai
    except ImportError:
        print("openai SDK: not installed (pip install openai to compare)")
        server.close()
        return
    theirs = await per_delta(sdk, url, chunks)
    server.close()
    label = f"openai SDK {openai.__version__}"
    print(f"{label:<34} {statistics.median(theirs):6.2f} µs per delta")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))

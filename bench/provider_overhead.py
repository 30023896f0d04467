"""Per-delta cost of the OpenAI-compatible adapter (httpx + our SSE parsing), next to the
official `openai` SDK when it is installed, on the same stream.

No network: both read one pre-built SSE body of N chunks through httpx.MockTransport,
so the figure is the client-side cost of turning bytes into text deltas.

    .venv/bin/python -m bench.provider_overhead [chunks]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import httpx

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


def transport(body: bytes) -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=body
        )
    )


async def ours(body: bytes) -> int:
    provider = OpenAIProvider(HttpModel(model="m", base_url="http://model.test/v1"))
    provider.transport = transport(body)
    request = ModelRequest(instructions="", items=(UserTurn(text="hi"),))
    return sum([1 async for e in provider.stream(request) if isinstance(e, ModelText)])


async def sdk(body: bytes) -> int:
    import httpx2  # type: ignore[import-not-found, unused-ignore]  # the HTTP client of openai 3
    import openai  # type: ignore[import-not-found, unused-ignore]  # optional, often absent

    mock = httpx2.MockTransport(
        lambda request: httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=body
        )
    )
    client = openai.AsyncOpenAI(
        api_key="x",
        base_url="http://model.test/v1",
        http_client=httpx2.AsyncClient(transport=mock),
    )
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    return sum([1 async for chunk in stream if chunk.choices and chunk.choices[0].delta.content])


async def per_delta(
    run: Callable[[bytes], Awaitable[int]], body: bytes, chunks: int, rounds: int = 7
) -> list[float]:
    await run(body)  # warm up
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        assert await run(body) == chunks
        samples.append((time.perf_counter() - started) / chunks * 1e6)
    return samples


async def main(chunks: int) -> None:
    body = sse_body(chunks)
    print(f"python {sys.version.split()[0]}, {chunks} chunks, median of 7 rounds, MockTransport")
    mine = await per_delta(ours, body, chunks)
    print(f"gateway adapter (httpx + own SSE): {statistics.median(mine):6.2f} µs per delta")
    try:
        import openai
    except ImportError:
        print("openai SDK: not installed (pip install openai to compare)")
        return
    theirs = await per_delta(sdk, body, chunks)
    label = f"openai SDK {openai.__version__}"
    print(f"{label:<34} {statistics.median(theirs):6.2f} µs per delta")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))

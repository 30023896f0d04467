"""How soon a cancel reaches the model's server, and how soon a stall is given up on.

For each HTTP model adapter (openai, anthropic, gemini), against llmock served in this
process (tests/mock_llm.py, as the provider tests use it) with the provider test agent
(``stall_timeout`` 0.5 s), client, gateway and llmock sharing one event loop:

- cancel: a reply that stalls for 10 s after its fourth chunk; at the first ``text.delta``
  the client sends ``response.cancel``; from then to the end of the upstream request as
  llmock's journal records it;
- stall: the same reply left to stall; from ``user.message`` to ``response.done``
  (the stall timeout, plus the rest).

Prints figures; asserts nothing. tests/test_providers.py checks that the upstream request
is cut (and that both end within sanity bounds ten times these figures).

    .venv/bin/python -m bench.cancel_upstream [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

from gateway.logging import configure_logging
from gateway.wire.v1 import ResponseCancel, ResponseDone, TextDelta, UserMessage
from tests.mock_llm import MockLLM, mock_llm, now
from tests.support import serving, session

__all__: list[str] = []

AGENT = Path(__file__).parent.parent / "tests" / "data" / "provider_agent.toml"
PROVIDERS = ["openai", "anthropic", "gemini"]
STALLING = (
    {"type": "reply", "text": "one two three four five six"},
    {"type": "stream_fault", "kind": "stall", "after_chunks": 4, "stall_seconds": 10},
)


async def _cancel(llm: MockLLM, url: str) -> float:
    await llm.script(*STALLING)
    async with session(url) as (conn, _):
        await conn.send(UserMessage(text="hi"))
        await conn.recv_until(lambda e: isinstance(e, TextDelta))
        cancelled_at = now()
        await conn.send(ResponseCancel())
        await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    record = (await llm.requests(wait=15))[-1]
    ended_at: float = record.ended_at
    return ended_at - cancelled_at


async def _stall(llm: MockLLM, url: str) -> float:
    await llm.script(*STALLING)
    async with session(url) as (conn, _):
        started = now()
        await conn.send(UserMessage(text="hi"))
        await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        return now() - started


def _line(name: str, samples: list[float]) -> str:
    return (
        f"{name:<27} n={len(samples):<4} p50 {statistics.median(samples) * 1000:7.1f} ms"
        f"  max {max(samples) * 1000:7.1f} ms"
    )


async def main(rounds: int) -> None:
    for provider in PROVIDERS:
        async with (
            mock_llm() as llm,
            serving(
                agent=str(AGENT), model=f"{provider}:mock-model", base_url=llm.base_url(provider)
            ) as gateway,
        ):
            cancels = [await _cancel(llm, gateway.url) for _ in range(rounds)]
            stalls = [await _stall(llm, gateway.url) for _ in range(max(1, rounds // 10))]
        print(_line(f"{provider} cancel->upstream", cancels))
        print(_line(f"{provider} stall->done", stalls))


if __name__ == "__main__":
    configure_logging("error")
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))

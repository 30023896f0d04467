"""llmock (a third-party mock of the OpenAI, Anthropic and Gemini APIs) on a free port."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from llmock.main import create_app
from llmock.simulation import MockResponseSettings

# Where each provider lives on an llmock server.
PREFIXES = {"openai": "/v1", "anthropic": "/anthropic", "gemini": "/gemini"}


@dataclass
class MockLLM:
    url: str
    app: Any
    client_ports: list[int] = field(default_factory=list)
    """The client port of every request, in order: one distinct port per connection."""

    def base_url(self, provider: str) -> str:
        return self.url + PREFIXES[provider]

    async def script(self, *behaviors: dict[str, Any]) -> None:
        """Queue behaviours: replies, tool calls, faults (llmock's scenario API)."""
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{self.url}/_llmock/scenario", json={"behaviors": list(behaviors)}
            )
            response.raise_for_status()

    async def requests(self, wait: float = 5.0) -> list[Any]:
        """Every request served so far (waits for those in flight, up to ``wait`` s)."""
        journal = self.app.state.llmock.journal
        return await asyncio.to_thread(journal.records, wait=wait)


@asynccontextmanager
async def asgi_server(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn in this event loop, on a free port; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@asynccontextmanager
async def mock_llm() -> AsyncIterator[MockLLM]:
    """An llmock server in this event loop, on a free port."""
    app = create_app(responses=MockResponseSettings(response_style="static", tool_mode="off"))
    ports: list[int] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/_llmock"):
            ports.append(scope["client"][1])
        await app(scope, receive, send)

    async with asgi_server(counting) as url:
        yield MockLLM(url=url, app=app, client_ports=ports)


def now() -> float:
    """The clock llmock's journal uses."""
    return time.monotonic()

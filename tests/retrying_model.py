"""A model wrapper for tests: a message that says "flaky" first fails once, and the model
tells the gateway it retries (``ModelRetrying``), as a real provider does after a 503."""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.core.model import ModelEvent, ModelRequest, ModelRetrying
from gateway.providers.base import Provider

__all__ = ["RetriesWhenFlaky"]


class RetriesWhenFlaky:
    """Wraps a provider; put it in ``Gateway.model.inner`` (tests/support.py)."""

    def __init__(self, inner: Provider, *, always: bool = False) -> None:
        self.inner = inner
        self.always = always

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        return self._stream(request)

    async def _stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if self.always or "flaky" in repr(request.items[-1]):
            yield ModelRetrying(attempt=1, delay=0.25, reason="HTTP 503")
        async for event in self.inner.stream(request):
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()

"""The model-provider interface: a request in, a stream of model events out.

The request and the events are the core's vocabulary (``gateway.model``); this module
holds only what is about providers: the protocol an adapter implements and what it
can do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol, runtime_checkable

import msgspec

from gateway.model import ModelEvent, ModelRequest

__all__ = ["Capabilities", "Provider", "ReportsRetries", "RetryListener"]


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a model can do; checked against the agent at startup."""

    tools: bool = True
    parallel_tool_calls: bool = True


class Provider(Protocol):
    """A model behind the gateway.

    ``stream`` yields text as it is generated, then any tool calls (several for a
    parallel step), then exactly one ``ModelFinish``. It raises
    ``gateway.errors.ProviderError`` when the model fails; cancelling the
    iteration must release the upstream request at once.
    """

    name: str
    capabilities: Capabilities

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...

    async def aclose(self) -> None:
        """Release pooled connections; called once when the gateway stops."""


RetryListener = Callable[[str], None]
"""Told the reason of each retried model request (``http_429``, ``ConnectError``...)."""


@runtime_checkable
class ReportsRetries(Protocol):
    """A provider that retries, and says so to a listener (the gateway's metrics).

    The listener is set by whoever serves the provider; providers never import metrics.
    """

    on_retry: RetryListener | None

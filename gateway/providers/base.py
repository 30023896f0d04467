"""The model-provider interface: a request in, a stream of model events out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

import msgspec

from gateway.transcript import Item

__all__ = [
    "Capabilities",
    "ModelEvent",
    "ModelFinish",
    "ModelRequest",
    "ModelText",
    "ModelToolCall",
    "ModelUsage",
    "Provider",
    "ReportsRetries",
    "RetryListener",
    "ToolSchema",
]


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a model can do; checked against the agent at startup."""

    tools: bool = True
    parallel_tool_calls: bool = True


class ToolSchema(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as offered to the model."""

    name: str
    description: str
    input_schema: dict[str, Any]


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the model gets for one step."""

    instructions: str
    items: tuple[Item, ...]
    tools: tuple[ToolSchema, ...] = ()


class ModelText(msgspec.Struct, frozen=True, tag="text"):
    """A piece of the model's text, as generated."""

    text: str


class ModelToolCall(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call"):
    """The model asks for a tool call. ``args`` is a JSON object."""

    name: str
    args: dict[str, Any]
    args_error: str | None = None
    """Set when the model's arguments were not a JSON object: the call fails at once."""


class ModelUsage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0


class ModelFinish(msgspec.Struct, frozen=True, kw_only=True, tag="finish"):
    """The step is over. ``reason`` is the provider's finish reason, normalised."""

    reason: str = "stop"
    usage: ModelUsage | None = None


ModelEvent = ModelText | ModelToolCall | ModelFinish


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

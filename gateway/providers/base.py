"""The model-provider interface: a request in, a stream of model events out.

The request and the events are the core's vocabulary (``gateway.core.model``); this module
holds only what is about providers: the protocol an adapter implements and what it
can do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, runtime_checkable

import msgspec

from gateway.core.model import ModelEvent, ModelRequest

__all__ = [
    "Capabilities",
    "ModelSink",
    "Provider",
    "Pushes",
    "ReportsRetries",
    "RetryListener",
    "Room",
    "Signal",
]


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a model can do; checked against the agent at startup."""

    tools: bool = True
    parallel_tool_calls: bool = True
    tool_choice: bool = True
    """Honours ``ModelRequest.tool_choice`` (``none``, ``required``, one tool)."""


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


ModelSink = Callable[[list[ModelEvent]], bool]
"""Takes events of the model, in ``stream``'s order: all those ready at once in one call
(they go out in one socket write); ``False`` when the step is over (it failed): the
provider then stops and sends nothing more."""


class Signal(Protocol):
    """Calls back once something happens (``gateway.shell.flag.Flag`` fits)."""

    def on_set(self, callback: Callable[[], None]) -> None: ...


class Room(Protocol):
    """Whether the session can take more of a model's events now: while ``full``, a
    provider that pushes waits for ``room`` (a session busy with other events holds a
    bounded backlog of the model's)."""

    full: bool

    @property
    def room(self) -> Signal: ...


@runtime_checkable
class Pushes(Protocol):
    """A provider that can also hand its events over from its own loop callbacks, with no
    task switch per event (``Provider.stream`` costs one per event that waits).

    ``push`` returns ``None`` when it would rather stream this request (the driver then
    calls ``stream``); else an asyncio future that ends once the last event was given to
    ``sink`` (or ``sink`` said stop), or fails as ``stream`` would raise. Cancelling it
    (the task awaiting it is cancelled) stops the events at once.
    """

    def push(
        self, request: ModelRequest, sink: ModelSink, room: Room
    ) -> Awaitable[None] | None: ...


RetryListener = Callable[[str], None]
"""Told the reason of each retried model request (``http_429``, ``ConnectError``...)."""


@runtime_checkable
class ReportsRetries(Protocol):
    """A provider that retries, and says so to a listener (the gateway's metrics).

    The listener is set by whoever serves the provider; providers never import metrics.
    """

    on_retry: RetryListener | None

"""A session's server tools, run on this node, and where their outcomes go.

A tool's progress and outcome go to the session's loop while the session is driven here.
Once it moved to another node (lease lost, or handed over at shutdown), they are posted to
the session's inbox in the store, for the node that owns it now; and the tools still running
here are cancelled at their calls' deadlines, which no core here watches any more. A tool
whose work lives elsewhere (a remote agent's task) keeps a handle to it with its call; a node
that adopts the session follows that work again (``ResumeTool``) instead of losing the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import structlog

from gateway.core.event import (
    Event,
    ResumeTool,
    RunTool,
    ToolDeferred,
    ToolFinished,
    ToolHandle,
    ToolNews,
    ToolProgress,
)
from gateway.core.session import Session
from gateway.errors import StoreUnavailable
from gateway.store import Store
from gateway.tools.base import Caller, failure_code, tool_failure
from gateway.tools.python import Progress
from gateway.tools.toolbox import Toolbox
from gateway.wire.routing import encode_routed

__all__ = ["ToolRunner"]

log = structlog.get_logger("gateway.driver")


_POSTING: set[asyncio.Task[None]] = set()
"""Posts of tool outcomes in flight (a task needs a reference until it is done)."""


class _Agent(Protocol):
    """Another agent a session may be handed to: here, its tools."""

    @property
    def toolbox(self) -> Toolbox: ...


class _Driven(Protocol):
    """What the tool runner needs of the session's driver."""

    session: Session
    moved: bool
    """The session left this node: it goes on elsewhere."""

    def feed(self, event: Event) -> None: ...


class ToolRunner:
    """Runs the server tools of one session, and reports how each went.

    Args:
        driver: the session's driver: outcomes are fed to it, while it has not moved.
        toolbox: the session's tools, for a call naming no other agent.
        agents: the other agents the session may be handed to, by name.
        store: where outcomes are posted once the session moved.
        clock: wall-clock seconds (the calls' deadlines are Unix times).
    """

    __slots__ = ("_agents", "_clock", "_driver", "_store", "_toolbox")

    def __init__(
        self,
        driver: _Driven,
        *,
        toolbox: Toolbox,
        agents: Mapping[str, _Agent],
        store: Store,
        clock: Callable[[], float],
    ) -> None:
        self._driver = driver
        self._toolbox = toolbox
        self._agents = agents
        self._store = store
        self._clock = clock

    async def run(self, effect: RunTool | ResumeTool) -> None:
        """Run the tool ``effect`` asks for (or, for a ``ResumeTool``, follow the work
        another node started) to its end, and report its outcome (the task of the effect)."""
        started = self._clock()
        call_id = effect.call_id
        progress = Progress(
            lambda payload: self.report(ToolProgress(call_id=call_id, payload=payload)),
            defer=lambda: self.report(ToolDeferred(call_id=call_id)),
            keep=lambda handle: self.report(ToolHandle(call_id=call_id, handle=handle)),
        )
        other = self._agents.get(effect.agent)
        toolbox = self._toolbox if other is None else other.toolbox
        session = self._driver.session
        caller = Caller.of(session.principal, session.time_zone, session.session_id)
        try:
            if isinstance(effect, ResumeTool):
                output = await toolbox.resume(effect.tool, effect.handle, progress, caller)
            else:
                output = await toolbox.call(effect.tool, effect.args, progress, caller)
        except Exception as exc:
            log.warning("tool_raised", call_id=call_id, tool=effect.tool, error=type(exc).__name__)
            self.report(
                ToolFinished(call_id=call_id, error=tool_failure(exc), code=failure_code(exc))
            )
        else:
            log.info(
                "tool_returned",
                call_id=call_id,
                tool=effect.tool,
                duration_ms=round((self._clock() - started) * 1000, 1),
            )
            self.report(ToolFinished(call_id=call_id, output=output))

    def report(self, event: ToolNews) -> None:
        """A server tool's news (outcome, progress, deferral, handle): for this driver,
        or, once the session moved to another node, posted to its inbox there."""
        if not self._driver.moved:
            self._driver.feed(event)
            return
        task = asyncio.create_task(self._post(event), name=f"gateway:post:{event.call_id}")
        _POSTING.add(task)
        task.add_done_callback(_POSTING.discard)

    async def _post(self, event: ToolNews) -> None:
        try:
            await self._store.post(self._driver.session.session_id, encode_routed(event))
        except StoreUnavailable as exc:
            log.warning("tool_outcome_not_posted", call_id=event.call_id, error=str(exc))
        else:
            log.info("tool_outcome_posted", call_id=event.call_id)

    def stop_at_deadlines(self, running: Iterable[tuple[str, asyncio.Task[None]]]) -> None:
        """The server tools still ``running`` here (call id, task), for a session that
        left: each is cancelled at its call's deadline (no core here does it any more)."""
        loop = asyncio.get_running_loop()
        deadlines = {call.call_id: call.deadline for call in self._driver.session.state().calls}
        for call_id, task in running:
            delay = max(0.0, deadlines.get(call_id, 0.0) - self._clock())
            loop.call_later(delay, task.cancel)

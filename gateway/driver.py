"""The asyncio shell around a Session: runs its effects and owns its timers.

Everything that happens to a session (a client frame, a model event, a tool's
return, a deadline) becomes one event in one queue, applied in order by one
task, so the session core never sees concurrency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec
import structlog

from gateway.errors import ProviderError
from gateway.event import (
    CallModel,
    CancelModel,
    CancelTool,
    Effect,
    Event,
    ModelFailed,
    ModelOutput,
    RunTool,
    Send,
    Tick,
    ToolFinished,
    ToolProgress,
)
from gateway.protocol import (
    Error,
    ResponseCreated,
    ResponseDone,
    ServerMsg,
    SessionCreated,
    ToolCalls,
    ToolStatus,
    encode,
)
from gateway.providers.base import ModelFinish, Provider
from gateway.session import Session
from gateway.tools import Progress, ServerTool

__all__ = ["Driver"]

log = structlog.get_logger("gateway.driver")

SendFn = Callable[[bytes], Awaitable[None]]


class Driver:
    """Runs one Session.

    Args:
        session: the pure core to drive.
        provider: the model.
        server_tools: the Python functions behind the session's server tools.
        send: writes one encoded event to the client; must not raise when the
            client is gone (the transport notices that on its own).
        clock: wall-clock seconds; deadlines on the wire are Unix times.
    """

    def __init__(
        self,
        session: Session,
        *,
        provider: Provider,
        server_tools: Mapping[str, ServerTool],
        send: SendFn,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._session = session
        self._provider = provider
        self._server_tools = server_tools
        self._send = send
        self._clock = clock
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """Model streams by step id and server tools by call id."""
        self._response_started: dict[str, float] = {}

    def feed(self, event: Event) -> None:
        """Queue an event for the session (from any task of this loop)."""
        self._events.put_nowait(event)

    @property
    def task_count(self) -> int:
        """Model streams and tools still running (0 once ``run`` has returned)."""
        return len(self._tasks)

    async def run(self) -> None:
        """Apply events until the session closes; then cancel and await all work."""
        try:
            while not self._session.closed:
                event = await self._next_event()
                self._session.receive(event, now=self._clock())
                for effect in self._session.effects():
                    await self._execute(effect)
        finally:
            await self._cancel_all()

    async def _next_event(self) -> Event:
        deadline = self._session.next_deadline()
        if deadline is None or not self._events.empty():
            return await self._events.get()
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                return await self._events.get()
        except TimeoutError:
            return Tick()

    async def _execute(self, effect: Effect) -> None:
        match effect:
            case Send(msg=msg):
                self._log_sent(msg)
                await self._send(encode(msg))
            case CallModel(step_id=step_id):
                self._start(step_id, self._stream_model(effect))
            case RunTool(call_id=call_id):
                log.info(
                    "tool_started",
                    call_id=call_id,
                    tool=effect.tool,
                    response_id=effect.response_id,
                )
                self._start(call_id, self._run_tool(effect))
            case CancelModel(step_id=key) | CancelTool(call_id=key):
                task = self._tasks.get(key)
                if task is not None:
                    task.cancel()

    def _start(self, key: str, work: Awaitable[None]) -> None:
        async def tracked() -> None:
            try:
                await work
            finally:
                self._tasks.pop(key, None)

        self._tasks[key] = asyncio.create_task(tracked(), name=f"gateway:{key}")

    async def _stream_model(self, effect: CallModel) -> None:
        step_id = effect.step_id
        finished = False
        try:
            async for event in self._provider.stream(effect.request):
                self.feed(ModelOutput(step_id, event))
                finished = isinstance(event, ModelFinish)
                if finished:
                    break
        except ProviderError as exc:
            log.warning("model_failed", response_id=effect.response_id, error=str(exc))
            self.feed(ModelFailed(step_id, f"the model failed: {exc}", retryable=exc.retryable))
            return
        except Exception:
            log.exception("model_crashed", response_id=effect.response_id)
            self.feed(ModelFailed(step_id, "the model failed unexpectedly"))
            return
        if not finished:
            self.feed(ModelFailed(step_id, "the model stream ended before it finished"))

    async def _run_tool(self, effect: RunTool) -> None:
        tool = self._server_tools.get(effect.tool)
        if tool is None:
            self.feed(ToolFinished(call_id=effect.call_id, error="the tool has no implementation"))
            return
        started = self._clock()
        call_id = effect.call_id
        progress = Progress(
            lambda payload: self.feed(ToolProgress(call_id=call_id, payload=payload))
        )
        try:
            output = await tool.invoke(effect.args, progress)
        except Exception as exc:
            log.warning(
                "tool_raised", call_id=effect.call_id, tool=effect.tool, error=type(exc).__name__
            )
            self.feed(ToolFinished(call_id=effect.call_id, error=f"{type(exc).__name__}: {exc}"))
        else:
            log.info(
                "tool_returned",
                call_id=effect.call_id,
                tool=effect.tool,
                duration_ms=round((self._clock() - started) * 1000, 1),
            )
            self.feed(ToolFinished(call_id=effect.call_id, output=output))

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _log_sent(self, msg: ServerMsg) -> None:
        """One line per noteworthy event; never user text or arguments, only sizes."""
        match msg:
            case SessionCreated(agent=agent, tools=tools):
                log.info(
                    "session_started",
                    agent=agent,
                    tools=len(tools),
                    metadata_size=len(msgspec.json.encode(self._session.metadata)),
                )
            case ResponseCreated(response_id=response_id):
                self._response_started[response_id] = self._clock()
                log.info("response_started", response_id=response_id)
            case ResponseDone(response_id=response_id, usage=usage):
                started = self._response_started.pop(response_id, self._clock())
                log.info(
                    "response_finished",
                    response_id=response_id,
                    status=msg.status,
                    duration_ms=round((self._clock() - started) * 1000, 1),
                    input_tokens=usage.input_tokens if usage else None,
                    output_tokens=usage.output_tokens if usage else None,
                )
            case ToolCalls(response_id=response_id, calls=calls):
                for call in calls:
                    log.info(
                        "client_call_sent",
                        response_id=response_id,
                        call_id=call.call_id,
                        tool=call.tool,
                        args_size=len(msgspec.json.encode(call.args)),
                    )
            case ToolStatus(status=status) if status not in ("running", "pending", "progress"):
                log.info(
                    "tool_call_settled",
                    response_id=msg.response_id,
                    call_id=msg.call_id,
                    tool=msg.tool,
                    status=status,
                    duplicate=msg.duplicate,
                )
            case Error(code=code):
                log.info("error_sent", code=code, call_id=msg.call_id, in_reply_to=msg.in_reply_to)
            case _:
                pass

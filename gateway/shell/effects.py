"""What a session committed, carried out: its events sent, its model steps and tools run.

Once a batch is durable (``gateway.shell.journal``), each event it sends goes to the
session's socket, if one is attached (``conn``: the driver attaches them), and to the
session's observers (logs, metrics); each model step and server tool it starts runs as a task
of its own, kept by its key (step id, call id) until it ends; a cancel stops one. When the
session ends they are all cancelled; when it moves to another node, its server tools go on,
each until its call's deadline (``ToolRunner.stop_at_deadlines``).

The observers are also told of the session's sockets coming and going and of its start and
end; one failing observer costs the others nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

import structlog

from gateway.core.durability import Sends
from gateway.core.event import (
    CallModel,
    CancelModel,
    CancelTool,
    ClearAudio,
    CommitAudio,
    Effect,
    EndSpeech,
    Listen,
    RunTool,
    SaveCall,
    Send,
    Speak,
    StopSpeaking,
)
from gateway.shell.connection import Connection
from gateway.shell.observe import SessionObserver
from gateway.shell.tool_runner import ToolRunner
from gateway.shell.voice import VoiceEffect
from gateway.wire.v1 import ServerMsg, encode

__all__ = ["Effects"]

log = structlog.get_logger("gateway.driver")


class Effects:
    """Carries out what one session committed.

    Args:
        observers: told every event the session sends, and its sockets coming and going.
        clock: wall-clock seconds, the time observers are told.
        tools: runs the session's server tools.
        model_step: the work of a model step (``ModelStep.run``), to run as a task.
        voice: carries out the voice effects (the session's audio).
    """

    __slots__ = (
        "_clock",
        "_model_step",
        "_observers",
        "_tasks",
        "_tool_keys",
        "_tools",
        "_voice",
        "conn",
    )

    def __init__(
        self,
        *,
        observers: Sequence[SessionObserver],
        clock: Callable[[], float],
        tools: ToolRunner,
        model_step: Callable[[CallModel], Coroutine[Any, Any, None]],
        voice: Callable[[VoiceEffect], None],
    ) -> None:
        self._observers = tuple(observers)
        self._clock = clock
        self._tools = tools
        self._model_step = model_step
        self._voice = voice
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """Model streams by step id and server tools by call id."""
        self._tool_keys: set[str] = set()
        """The keys of ``_tasks`` that are server tools."""
        self.conn: Connection | None = None
        """The session's socket, while one is attached (the driver attaches them)."""

    def add_observer(self, observer: SessionObserver) -> None:
        """Tell ``observer`` too about the session from now on."""
        self._observers = (*self._observers, observer)

    def carry_out(self, effects: list[Effect], sends: Sends) -> None:
        """Send the committed events, and start or stop what the other effects ask for."""
        self.sent([msg for msg, _ in sends])
        conn = self.conn
        if len(sends) == len(effects):  # only events to send, as on the short path
            if conn is not None:
                conn.send_all(sends)  # all of them in one write
            return
        encoded = iter(sends)
        for effect in effects:
            if type(effect) is Send:
                msg, data = next(encoded)
                if conn is not None:
                    conn.queue(msg, data)
            elif type(effect) is not SaveCall:
                self._execute(effect)
        if conn is not None and sends:
            conn.flush()

    def send_now(self, msg: ServerMsg) -> None:
        """Send ``msg`` on the socket, if one is attached, outside the session's log: news
        about the session itself (its store does not answer)."""
        if self.conn is not None:
            self.conn.send(msg, encode(msg))

    def sent(self, msgs: Iterable[ServerMsg]) -> None:
        """Tell the observers the session sent ``msgs``."""
        # On the path of every delta: a plain loop, no closure per event.
        now = self._clock()
        for msg in msgs:
            for observer in self._observers:
                try:
                    observer.sent(msg, now)
                except Exception:
                    log.exception("observer_failed", observer=type(observer).__name__)

    def tell(self, news: Callable[[SessionObserver, float], None]) -> None:
        """Give every observer the news; one failing observer costs the others nothing."""
        now = self._clock()
        for observer in self._observers:
            try:
                news(observer, now)
            except Exception:
                log.exception("observer_failed", observer=type(observer).__name__)

    def _execute(self, effect: Effect) -> None:
        """Carry out an effect other than a send (committed already, as are calls)."""
        match effect:
            case CallModel(step_id=step_id):
                self._start(step_id, self._model_step(effect))
            case RunTool(call_id=call_id):
                log.info(
                    "tool_started",
                    call_id=call_id,
                    tool=effect.tool,
                    response_id=effect.response_id,
                )
                self._tool_keys.add(call_id)
                self._start(call_id, self._tools.run(effect))
            case CancelModel(step_id=key) | CancelTool(call_id=key):
                task = self._tasks.get(key)
                if task is not None:
                    task.cancel()
            case Speak() | EndSpeech() | StopSpeaking() | Listen() | CommitAudio() | ClearAudio():
                self._voice(effect)

    def _start(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        # A done callback, not a wrapping coroutine: a model stream resumes once per delta,
        # and each resume would pass through one more frame.
        task = asyncio.create_task(work, name=f"gateway:{key}")
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._forget_task(key, task))

    def _forget_task(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
            self._tool_keys.discard(key)

    def leave(self) -> None:
        """The session moved to another node: cancel its model steps; its server tools go
        on (their outcomes are posted), each cancelled at its call's deadline."""
        for key, task in self._tasks.items():
            if key not in self._tool_keys:
                task.cancel()
        self._tools.stop_at_deadlines(
            [(key, self._tasks[key]) for key in self._tool_keys if key in self._tasks]
        )

    async def cancel_all(self) -> None:
        """The session ended: cancel all its work, and wait for it to stop."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

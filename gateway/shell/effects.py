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

import msgspec
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
    ResumeTool,
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
from gateway.wire.v1 import ClientCall, ServerMsg, ToolCalls, encode

__all__ = ["Effects", "calls_for", "for_device"]

log = structlog.get_logger("gateway.driver")


def calls_for(
    calls: list[ClientCall], functions: frozenset[str], declared: frozenset[str]
) -> list[ClientCall]:
    """The calls of ``calls`` a device that declared ``functions`` gets, among devices that
    declared ``declared`` in all: those of its functions, and those of no device's (a
    client function of the agent's own, which every device of its app offers; a server
    tool in manual mode; a widget: the user answers on any device)."""
    return [c for c in calls if c.tool in functions or c.tool not in declared or c.kind != "client"]


def for_device(
    msg: ServerMsg, data: bytes, functions: frozenset[str], declared: frozenset[str]
) -> tuple[ServerMsg, bytes]:
    """An event as a device that declared ``functions`` gets it: a ``tool.calls`` without
    the calls of other devices' functions (same ``seq``: none goes missing, possibly with
    no call left); any other event as it is."""
    if type(msg) is not ToolCalls:
        return msg, data
    calls = calls_for(msg.calls, functions, declared)
    if len(calls) == len(msg.calls):
        return msg, data
    mine = msgspec.structs.replace(msg, calls=calls)
    return mine, encode(mine)


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
        "conns",
        "declared",
        "routed",
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
        self.conns: list[Connection] = []
        """The session's sockets, in the order they attached (the driver attaches them):
        one, or one per device when several share the session."""
        self.routed = False
        """Several devices joined the session: each socket gets the calls of the functions
        its device declared (``addressed``), not every call."""
        self.declared: Callable[[], frozenset[str]] = frozenset
        """The names of the functions the session's devices declared, all together."""

    def add_observer(self, observer: SessionObserver) -> None:
        """Tell ``observer`` too about the session from now on."""
        self._observers = (*self._observers, observer)

    @property
    def conn(self) -> Connection | None:
        """The socket that attached last, if any: the one that hears the session's audio."""
        conns = self.conns
        return conns[-1] if conns else None

    def carry_out(self, effects: list[Effect], sends: Sends) -> None:
        """Send the committed events, and start or stop what the other effects ask for."""
        self.sent([msg for msg, _ in sends])
        conns = self.conns
        if len(sends) == len(effects):  # only events to send, as on the short path
            if len(conns) == 1 and not self.routed:
                conns[0].send_all(sends)  # all of them in one write
            else:
                for conn in conns:
                    conn.send_all(self.addressed(sends, conn))
            return
        encoded = iter(sends)
        for effect in effects:
            if type(effect) is Send:
                msg, data = next(encoded)
                if self.routed and type(msg) is ToolCalls:
                    for conn in conns:
                        for mine, encoded_mine in self.addressed([(msg, data)], conn):
                            conn.queue(mine, encoded_mine)
                else:
                    for conn in conns:
                        conn.queue(msg, data)
            elif type(effect) is not SaveCall:
                self._execute(effect)
        if sends:
            for conn in conns:
                conn.flush()

    def addressed(self, sends: Sends, conn: Connection) -> Sends:
        """``sends`` as ``conn`` gets them: with several devices, each ``tool.calls`` holds
        only the calls of the functions ``conn``'s device declared (see ``for_device``)."""
        functions = conn.functions
        if not self.routed or functions is None:
            return sends
        if all(type(msg) is not ToolCalls for msg, _ in sends):
            return sends
        declared = self.declared()
        return [for_device(msg, data, functions, declared) for msg, data in sends]

    def send_now(self, msg: ServerMsg) -> None:
        """Send ``msg`` on every attached socket, outside the session's log: news about the
        session itself (its store does not answer)."""
        data = encode(msg)
        for conn in self.conns:
            conn.send(msg, data)

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
            case RunTool(call_id=call_id) | ResumeTool(call_id=call_id):
                log.info(
                    "tool_started" if isinstance(effect, RunTool) else "tool_resumed",
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

"""A deterministic simulation of gateway nodes sharing one store: the ownership protocol of
issue 28 under seeded schedules, replayable from the seed.

What runs is the gateway's own code: two or three ``Runtime`` objects in one process (each
with its node id), their ``Driver``s and ``Session``s, the transport's ``_serve`` for every
socket (so a ``session.resume`` goes through ``Runtime.find_session``, ``_adopt`` and
``_take_over``, then ``Driver.attach``, exactly as on a real node), one ``MemoryStore``
holding every session. What is simulated is around it:

- **The store's round trips.** Each node sees the shared ``MemoryStore`` through a
  ``NodeStore``: a delegating class, not a subclass, so that ``Runtime`` treats it as durable
  (leases, fences, adoption), as it treats Redis. Every call first waits for the scheduler,
  and now and then its answer does too (the store applied it, the node does not know yet):
  "node A's commit is in flight while node B takes the lease and loads the state" is one
  schedule among others.
- **The model** (``SimModel``): its answer is a function of the request alone, chosen as
  the scripted model chooses (the tool outcomes and notes that end the transcript, else the
  last user message), so that a step run again on the same request says the same words;
  each chunk of its stream waits for the scheduler, so that sockets are cut and sessions
  move mid-stream.
- **Server tools**: ``tally`` (sync) and ``track`` (``execution="async"``), each finishing
  when the scheduler says, on the node that started it, whether or not that node still owns
  the session (a late completion); every run is counted.
- **Clients** (``SimClient``), one per conversation: each does what the shipped SDK does
  (keeps ``last_seq``, resends unconfirmed messages and results after a resume, answers
  the client function ``device``, acks), over a fake socket (``SimSocket``) that records
  every frame the gateway writes. A cut drops the socket as a dead TCP connection would
  (also while a resume is under way: the SDK gives up on that socket and tries again, and
  the node goes on with the dead one, as uvicorn does not cancel its task); the client
  resumes on the node the scheduler picks (a load balancer without stickiness).

The scheduler (``Sim``, one ``random.Random(seed)``) picks one action at a time among those
possible: let a store call (or its answer) through, release a model chunk, finish a tool,
send a user message, answer a client call, ack, cut a socket, resume on a node, run one
lease-renewal pass on a node, let time pass to the loop's next short timer. After each
action the event loop runs until every task is blocked (``Sim.settle``), so a schedule is
a function of its seed alone. Then the schedule drains (no new message, no cut; a renewal
pass on every node when nothing else is left, as the renewal loop would in time) and the
end state is checked.

The trace of a schedule lists every action (``#n``) and, under it, what followed: store
answers (``= ...``), frames reaching clients (``c0 <- B seq 12 text.delta 'w3 '``), tool
runs, the gateway's warnings and its lines about adoptions, moves and resumes (each with
the node that logged it), and violations (``!!``). A schedule stops after the action that
broke an invariant (later ones often follow from it), unless ``keep_going``.

Invariants, checked as frames reach the clients and once the schedule has settled:

0. nothing unexpected: no error event, no close but 1012/1013, every resume answered;
1. an event reaches a client only once it is durable: the store's log holds its ``seq``
   with the same bytes;
2. a client sees every ``seq`` exactly once and in order, across resumes, never a
   ``resume_gap``;
3. a node that takes a session over never sends text the client has: each step's deltas
   join to its ``text.done``, every answer is exactly the expected text, said once;
4. a server tool runs once per call;
5. an async result is delivered exactly once (one ``tool.status completed``, one note to
   the model), whichever node finishes it (no node dies here, so no loss is tolerated);
6. a client call still open is offered again on resume, and its result applies once;
7. a node that lost the fence puts nothing on a socket afterwards: no event whose commit
   the fence refused, nothing from a driver that let its session go (``Driver.moved``).

An error line logged by the gateway counts against invariant 0 too.

Where the harness departs from a running gateway, and why:

- ``Runtime`` passes no ``clock`` to its drivers, which read the wall clock for deadlines
  and the session TTL: every deadline, TTL and lease here is an hour, so none runs out.
  Deadline paths (``tool_timeout``, expiry) are not explored.
- The event loop's clock is virtual (``VirtualLoop``): it moves only by the action "time
  passes", to the next timer when that is at most ``_SHORT_TIMER`` away (a retry, a
  backoff), so that nothing the gateway times with the loop depends on how fast this
  machine runs.
- Lease renewal: ``Runtime._renew_leases`` is a loop that sleeps a third of the lease
  between passes; ``Sim.renewal_pass`` runs one pass (``Runtime.renew_leases``) when the
  scheduler says.
- ``gateway.shell.runtime.new_id`` is replaced for the run by a counter (``resp_12``, ``call_7``):
  readable traces, and the same ids at every replay.
- Each ``Runtime``'s ``_drive`` and ``connection`` are wrapped on the instance, only to
  record which driver holds which socket (invariant 7); the gateway's log lines go to the
  trace instead of stdout (``structlog.testing.capture_logs``).
- Nodes do not die here: a tool's outcome has no excuse to be lost.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import re
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar, cast
from unittest import mock

import msgspec
import structlog
import structlog.testing
from starlette.websockets import WebSocket

import gateway.shell.runtime
from gateway.agent.file import Agent
from gateway.config import Config
from gateway.core.call import Call
from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall
from gateway.core.principal import ANONYMOUS
from gateway.core.state import SessionState, decode_state
from gateway.core.tool import ToolDef
from gateway.core.transcript import (
    CANCELLED,
    PENDING,
    AssistantTurn,
    ContextNote,
    Item,
    ToolOutcome,
    UserTurn,
    parse_completion_note,
)
from gateway.edge.v1_endpoint import _serve
from gateway.errors import CloseCode
from gateway.providers.base import Capabilities
from gateway.shell.connection import FRAME_WRITER_SCOPE_KEY, Connection, Socket
from gateway.shell.driver import Driver
from gateway.shell.runtime import Runtime
from gateway.store import Lease, LeaseLost, MemoryStore, SessionRecord
from gateway.tools.python import PythonTools, ServerTool, tool
from gateway.tools.toolbox import Toolbox
from gateway.wire.v1 import (
    SUBPROTOCOL,
    Ack,
    ClientMsg,
    Error,
    Outbound,
    ResponseCreated,
    ResponseDone,
    SessionCreated,
    SessionResume,
    SessionResumed,
    SessionSnapshot,
    SessionStart,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
    decode_server,
    encode,
)

__all__ = ["INVARIANTS", "Outcome", "Violation", "run_schedule"]

T = TypeVar("T")

LONG = 3600.0
"""Seconds of every deadline, TTL and lease: nothing runs out during a schedule (see the
module docstring)."""

INVARIANTS = {
    0: "nothing unexpected (no error, no final close, every resume answered)",
    1: "an event reaches a client only once it is durable",
    2: "every seq exactly once and in order, never resume_gap",
    3: "no text sent twice; every answer exactly as expected, said once",
    4: "a server tool runs once per call",
    5: "an async result is delivered exactly once",
    6: "a client call is offered again on resume and applies once",
    7: "a node that lost the fence puts nothing on a socket",
}

# How likely the scheduler picks each kind of action, among those possible.
_WEIGHTS = {
    "store": 6.0,
    "model": 4.0,
    "tool": 1.0,
    "answer": 2.0,
    "resume": 3.0,
    "send": 2.0,
    "ack": 2.5,
    "cut": 0.4,
    "renew": 0.4,
    "time": 0.5,
}
_DRAIN = ("store", "model", "tool", "answer", "resume", "ack", "time")
"""The actions that settle a schedule at its end: no new message, no cut, no renewal (but
one pass on every node whenever nothing else is left)."""
_ANSWER_HELD = 0.25
"""How often a store call's answer waits for the scheduler too (applied, not yet known)."""
_LOGGED = frozenset(
    {
        "session_adopted",
        "session_moved",
        "session_taken_over",
        "session_resumed",
        "resume_gap",
        "tool_outcome_posted",
        "connection_refused",
    }
)
"""The gateway's info lines copied into the trace (besides every warning)."""
_SHORT_TIMER = 5.0
"""Seconds: time passes (the loop's clock jumps to the next timer) only for a timer this
close, a retry or a backoff; leases, TTLs and deadlines are an hour away and never fire."""
_DRAIN_STEPS = 1_500
_SETTLE_ROUNDS = 10_000
_MAX_OUTSTANDING = 2
"""User messages a client may have waiting for their response at once (one queued)."""


# ---------------------------------------------------------------------- the event loop


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the scheduler says (``now``): timers set
    by the gateway (the driver's round budget, ``asyncio.timeout``, a retry's sleep) fire
    at the same point of a schedule on a fast machine and a slow one. The simulation's own
    task is always runnable, so the loop never waits for a timer in real time."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def runnable(self) -> int:
        """Callbacks ready to run now (asyncio has no public way to ask)."""
        return len(self._ready)  # type: ignore[attr-defined]  # the loop's ready queue

    def next_timer(self) -> float | None:
        """When the next timer is due, if one is set (asyncio has no public way either)."""
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        return min((t.when() for t in scheduled if not t.cancelled()), default=None)


def _run_now(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (``MemoryStore``'s methods), at once:
    the checks read the shared store from frame callbacks, which cannot await."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coro.close()
    raise RuntimeError("the memory store suspended")


# ---------------------------------------------------------------------- the world


@dataclass(frozen=True)
class Violation:
    invariant: int
    step: int
    message: str

    def __str__(self) -> str:
        return f"invariant {self.invariant} at #{self.step}: {self.message}"


@dataclass
class Outcome:
    """What one schedule did."""

    seed: int
    violations: list[Violation]
    trace: list[str]
    stats: dict[str, int]

    def headline(self) -> str:
        first = self.violations[0] if self.violations else None
        return f"seed {self.seed}: {first or 'passed'}"

    def report(self) -> str:
        lines = [f"seed {self.seed}, {len(self.trace)} trace lines, {self.stats}"]
        lines += [f"  {v} ({INVARIANTS[v.invariant]})" for v in self.violations]
        lines.append("trace (#n: an action; indented: what followed it):")
        lines += self.trace
        lines.append(
            f"replay: OWNERSHIP_SEED={self.seed} .venv/bin/python -m pytest tests/test_ownership.py"
        )
        return "\n".join(lines)


@dataclass(eq=False)
class Waiter:
    """Something of the gateway's waiting for the scheduler: a store call or its answer, a
    model's next chunk, a server tool's end."""

    kind: Literal["store", "model", "tool"]
    label: str
    future: asyncio.Future[None]


@dataclass
class ToolRun:
    node: str
    tool: str
    tag: str
    started: int
    ended: str = "running"


class Node:
    """One gateway node: its runtime, and its view of the shared store."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.name = name
        self.store = NodeStore(sim, name, sim.inner)
        config = Config(
            host="127.0.0.1",
            no_auth=True,
            node_id=name,
            lease_ttl=LONG,
            session_ttl=LONG,
            client_call_timeout=LONG,
            server_tool_timeout=LONG,
            first_message_timeout=LONG,
            max_messages_per_second=None,
            max_message_burst=None,
            send_timeout=None,
        )
        self.runtime = runtime = Runtime(config, _agent(name, sim), store=self.store)
        self.drivers: list[Driver] = []
        """Every driver this node ran: the runtime forgets one once another replaced it."""
        self.sockets: dict[Connection, SimSocket] = {}
        # Wrapped on this instance, only to know which driver wrote a frame (invariant 7).
        drive, connect = runtime._drive, runtime.connection

        def recorded_drive(*args: Any, **kwargs: Any) -> Driver:
            driver = drive(*args, **kwargs)
            self.drivers.append(driver)
            return driver

        def recorded_connection(socket: Socket, **options: Any) -> Connection:
            conn = connect(socket, **options)
            self.sockets[conn] = cast(SimSocket, socket)
            return conn

        runtime._drive = recorded_drive  # type: ignore[method-assign]
        runtime.connection = recorded_connection  # type: ignore[method-assign]

    def drivers_of(self, socket: SimSocket) -> list[Driver]:
        """The drivers whose socket is ``socket`` now."""
        return [
            d
            for d in self.drivers
            if d.connection is not None and self.sockets.get(d.connection) is socket
        ]


class Sim:
    """The scheduler, the shared store, the nodes, the clients and the checks of one
    schedule."""

    def __init__(self, seed: int, *, keep_going: bool = False) -> None:
        self.seed = seed
        self.keep_going = keep_going
        """Go on after a violation (clients resume after any close), to see every
        invariant a schedule breaks, not only the first; later ones may follow from it."""
        self.rng = random.Random(seed)
        self.step = 0
        self.trace: list[str] = []
        self.violations: list[Violation] = []
        self.stats: dict[str, int] = {}
        self.inner = MemoryStore()
        self.waiting: list[Waiter] = []
        self.open = False
        """Tearing down: nothing waits for the scheduler any more."""
        self.tasks: list[asyncio.Task[None]] = []
        """Sockets' and renewals' tasks (the loop keeps only weak references to tasks)."""
        self.names: dict[str, str] = {}
        """session id -> the client's name, for the trace."""
        self.runs: dict[tuple[str, str], list[ToolRun]] = {}
        """(tool, tag) -> every run of it."""
        self.progress = 0
        """Frames written, store calls other than renewals, tools finished: what tells the
        drain that a renewal pass changed something."""
        self.refused: dict[tuple[str, str, int], bytes] = {}
        """(node, session id, seq) -> an event whose commit the fence refused."""
        self._ids = 0
        self.nodes: list[Node] = []
        self.clients: list[SimClient] = []

    # ------------------------------------------------------------------ bookkeeping

    def new_id(self, prefix: str) -> str:
        """``gateway.shell.runtime.new_id`` for the run: a counter, the same at every replay."""
        self._ids += 1
        return f"{prefix}_{self._ids}"

    def note(self, text: str) -> None:
        self.trace.append(f"      {text}")

    def count(self, stat: str) -> None:
        self.stats[stat] = self.stats.get(stat, 0) + 1

    def violate(self, invariant: int, message: str) -> None:
        self.violations.append(Violation(invariant, self.step, message))
        self.trace.append(f"      !! invariant {invariant}: {message}")

    def harness_failed(self, exc: Exception) -> None:
        self.violate(0, f"the harness failed: {exc!r}")
        self.trace.append("".join(traceback.format_exception(exc)))

    def who(self, session_id: str | None) -> str:
        if session_id is None:
            return "?"
        return self.names.get(session_id, session_id)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # ------------------------------------------------------------------ waiting

    async def wait(self, kind: Literal["store", "model", "tool"], label: str) -> None:
        """Wait until the scheduler lets ``label`` go on."""
        if self.open:
            return
        waiter = Waiter(kind, label, asyncio.get_running_loop().create_future())
        self.waiting.append(waiter)
        try:
            await waiter.future
        finally:
            if waiter in self.waiting:  # cancelled while waiting: its task was
                self.waiting.remove(waiter)

    async def answer(self, label: str) -> None:
        """A store call was applied: its answer reaches the node now, or waits too."""
        if not self.open and self.rng.random() < _ANSWER_HELD:
            await self.wait("store", f"answer: {label}")
        elif not self.open:
            self.note(f"= {label}")

    def release(self, waiter: Waiter) -> None:
        self.waiting.remove(waiter)
        waiter.future.set_result(None)

    # ------------------------------------------------------------------ running

    async def settle(self) -> None:
        """Run the loop until every task waits on something only an action releases."""
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualLoop)
        for _ in range(_SETTLE_ROUNDS):
            await asyncio.sleep(0)
            # Back here with nothing else ready: every other task is blocked on a future
            # (a waiter, a queue, a socket), not on the loop.
            if not loop.runnable():
                return
        raise AssertionError(f"seed {self.seed}: the gateway never went quiet")

    def spawn(self, work: Coroutine[Any, Any, None], name: str, node: str) -> None:
        """Run ``work`` as a task of ``node``: its log lines, and those of the tasks it
        starts (the driver, its model and tools), name the node."""
        context = contextvars.copy_context()
        context.run(structlog.contextvars.bind_contextvars, node=node)
        self.tasks.append(asyncio.create_task(work, name=name, context=context))

    def log_line(self, _: Any, method: str, event: MutableMapping[str, Any]) -> NoReturn:
        """A structlog processor: the gateway's telling lines go into the trace, an error
        is a violation, and nothing reaches stdout."""
        name = event.pop("event", "?")
        node = event.pop("node", None)
        if node is None:  # a runtime starting (no --token-secret, --no-auth): not news
            raise structlog.DropEvent
        who = self.who(event.pop("session_id", None))
        details = " ".join(f"{key}={value}" for key, value in event.items())
        if method in ("error", "exception", "critical"):
            self.violate(0, f"{node} logged {method} {name} ({who}) {details}")
        elif method == "warning" or name in _LOGGED:
            self.note(f"log {node}: {name} {who} {details}")
        raise structlog.DropEvent

    async def run(self, actions: int) -> None:
        names = "ABC"[: self.rng.choice((2, 3))]
        self.nodes = [Node(self, name) for name in names]
        self.clients = [SimClient(self, f"c{i}") for i in range(self.rng.choice((1, 2)))]
        self.stats |= {"nodes": len(self.nodes), "clients": len(self.clients)}
        try:
            for client in self.clients:
                self.act(f"{client.name} starts a session on {client.start(self.pick_node())}")
            await self.settle()
            for _ in range(actions):
                if not self.pick(tuple(_WEIGHTS)):
                    break
                await self.settle()
                if self.violations and not self.keep_going:
                    return
            await self.drain()
            if not self.violations or self.keep_going:
                self.final_checks()
        finally:
            await self.teardown()

    def act(self, text: str) -> None:
        self.step += 1
        self.trace.append(f"#{self.step} {text}")

    def pick_node(self) -> Node:
        return self.rng.choice(self.nodes)

    def pick(self, kinds: Sequence[str]) -> bool:
        """Take one action among ``kinds`` (those possible now); ``False`` if none is."""
        possible = {kind: self.options(kind) for kind in kinds}
        enabled = sorted(kind for kind, targets in possible.items() if targets)
        if not enabled:
            return False
        kind = self.rng.choices(enabled, weights=[_WEIGHTS[k] for k in enabled])[0]
        self.do(kind, self.rng.choice(possible[kind]))
        return True

    def options(self, kind: str) -> list[Any]:
        """What an action of ``kind`` may be applied to now."""
        match kind:
            case "store" | "model" | "tool":
                return [w for w in self.waiting if w.kind == kind]
            case "answer":
                return [c for c in self.clients if c.live and c.answerable()]
            case "resume":
                return [c for c in self.clients if c.state == "down"]
            case "send":
                return [c for c in self.clients if c.live and c.may_send()]
            case "ack":
                return [c for c in self.clients if c.live and c.last_seq > c.acked]
            case "cut":
                return [c for c in self.clients if c.socket and c.session_id]
            case "renew":
                return list(self.nodes)
            case "time":
                loop = asyncio.get_running_loop()
                assert isinstance(loop, VirtualLoop)
                due = loop.next_timer()
                return [due] if due is not None and due - loop.now <= _SHORT_TIMER else []
        raise AssertionError(kind)

    def do(self, kind: str, target: Any) -> None:
        if kind in ("store", "model", "tool"):
            self.act(f"go on: {target.label}")
            self.release(target)
            return
        if kind == "time":
            loop = asyncio.get_running_loop()
            assert isinstance(loop, VirtualLoop)
            self.act(f"time passes: {target - loop.now:.3f} s, to the next timer")
            loop.now = target
            return
        if kind == "renew":
            self.act(f"lease renewal pass on {target.name}")
            self.spawn(self.renewal_pass(target), f"sim:renew:{target.name}", target.name)
            return
        client: SimClient = target
        match kind:
            case "answer":
                client.answer_a_call()
            case "resume":
                node = self.pick_node()
                self.act(f"{client.name} resumes on {node.name} from seq {client.last_seq}")
                client.resume(node)
            case "send":
                client.send_message()
            case "ack":
                self.act(f"{client.name} acks seq {client.last_seq}")
                client.ack()
            case "cut":
                self.act(f"cut {client.name}'s socket {client.socket_label()}")
                client.cut()

    async def renewal_pass(self, node: Node) -> None:
        """One pass of the node's lease renewals (``Runtime.renew_leases``, what its renewal
        loop runs every third of the lease)."""
        await node.runtime.renew_leases()

    async def drain(self) -> None:
        """Let everything in flight finish: no new message, no cut; a renewal pass on every
        node whenever nothing else is left (as the renewal loop would, in time)."""
        self.trace.append("-- drain: no more messages, cuts or random renewals")
        renewed_at = -1
        for _ in range(_DRAIN_STEPS):
            if not self.pick(_DRAIN):
                if renewed_at == self.progress:
                    return  # the last renewal pass changed nothing: all settled
                renewed_at = self.progress
                self.act("lease renewal pass on every node")
                for node in self.nodes:
                    self.spawn(self.renewal_pass(node), f"sim:renew:{node.name}", node.name)
            await self.settle()
            if self.violations and not self.keep_going:
                return
        self.violate(0, f"still busy after {_DRAIN_STEPS} actions of drain")

    async def teardown(self) -> None:
        """Stop everything without the scheduler: no task may be left waiting on it."""
        self.open = True
        for waiter in list(self.waiting):
            self.release(waiter)
        for client in self.clients:
            if client.socket is not None:
                client.socket.drop()
        for node in self.nodes:
            await self.finish(node.runtime.aclose(), f"closing {node.name}")
        current = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def finish(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Await ``work`` without ever letting the loop wait for a timer (its clock stands
        still: it would wait for real): a task, run until it is done or stuck."""
        task = asyncio.create_task(work, name=f"sim:{what}")
        for _ in range(100):
            await self.settle()
            if task.done():
                await task
                return
        task.cancel()
        raise AssertionError(f"seed {self.seed}: {what} never finished")

    # ------------------------------------------------------------------ checks on frames

    def delivered(self, socket: SimSocket, data: bytes) -> None:
        """A frame the node of ``socket`` wrote: check it, then hand it to the client."""
        self.progress += 1
        msg = decode_server(data)
        client = socket.owner
        if socket is not client.socket:
            self.violate(0, f"{socket.label} got {describe(msg)} after {client.name} left it")
            return
        session_id = client.session_id
        if isinstance(msg, SessionCreated):
            session_id = msg.session_id
        if msg.seq and session_id is not None:
            self.check_durable(socket, session_id, msg, data)
        self.check_owner(socket, msg)
        client.receive(socket, msg)

    def check_durable(self, socket: SimSocket, session_id: str, msg: Outbound, data: bytes) -> None:
        """Invariant 1, and 7 for an event whose commit the fence refused."""
        seq, node, who = msg.seq, socket.node, socket.owner.name
        logged = _run_now(self.inner.events_after(session_id, seq - 1))
        if logged and logged[0] == data:
            return
        refused = self.refused.get((node, session_id, seq)) == data
        if logged is None:
            held = "no longer holds it (trimmed)"
        elif not logged:
            held = "does not hold it"
        else:
            held = f"holds {describe(decode_server(logged[0]))} there"
        why = "; its commit was refused by the fence (LeaseLost)" if refused else ""
        self.violate(
            7 if refused else 1,
            f"{node} sent {describe(msg)} to {who} on {socket.label}, but the store's log"
            f" {held}{why} ({who} has seq {socket.owner.last_seq}, acked {socket.owner.acked})",
        )

    def check_owner(self, socket: SimSocket, msg: Outbound) -> None:
        """Invariant 7: a driver that let its session go (lease lost) writes nothing more."""
        for driver in self.node(socket.node).drivers_of(socket):
            if driver.moved:
                fence = driver.lease.fence if driver.lease else "-"
                self.violate(
                    7,
                    f"{socket.node}'s driver of fence {fence} sent {describe(msg)} to"
                    f" {socket.owner.name} on {socket.label} after it let the session go",
                )

    def check_request(self, node: str, request: ModelRequest) -> None:
        """Invariants 4-6 at the model: each call's outcome is in the transcript once."""
        seen: dict[tuple[str, str], int] = {}
        for item in request.items:
            if isinstance(item, ToolOutcome):
                key = (f"{item.name} outcome", item.call_id)
            elif isinstance(item, ContextNote) and item.call_id:
                key = ("completion note", item.call_id)
            else:
                continue
            seen[key] = seen.get(key, 0) + 1
        for (kind, call_id), times in seen.items():
            if times > 1:
                invariant = 6 if kind.startswith("device") else 4 if kind.startswith("tally") else 5
                self.violate(
                    invariant, f"the model on {node} got the {kind} of {call_id} {times} times"
                )

    # ------------------------------------------------------------------ checks at the end

    def final_checks(self) -> None:
        self.trace.append("-- final checks")
        for client in self.clients:
            client.final_checks()
        for (name, tag), runs in sorted(self.runs.items()):
            unfinished = [r for r in runs if r.ended == "running"]
            if unfinished:
                self.violate(4, f"{name} {tag} still running on {unfinished[0].node}")
        if self.waiting:
            self.violate(0, f"still waiting after the drain: {[w.label for w in self.waiting]}")

    def tool_log(self, tag: str) -> str:
        runs = [r for (_, t), rs in self.runs.items() if t == tag for r in rs]
        return (
            ", ".join(f"{r.tool} ran on {r.node} from #{r.started}, {r.ended}" for r in runs)
            or "never ran"
        )


# ---------------------------------------------------------------------- the store


class NodeStore:
    """One node's view of the shared ``MemoryStore``: every call waits for the scheduler,
    then runs on the shared store; now and then its answer waits too. A delegating class,
    not a subclass: ``Runtime`` treats any store but a ``MemoryStore`` as durable."""

    def __init__(self, sim: Sim, node: str, inner: MemoryStore) -> None:
        self._sim = sim
        self._node = node
        self._inner = inner

    async def _call(self, label: str, op: Coroutine[Any, Any, T]) -> T:
        text = f"{self._node} {label}"
        if not label.startswith("renew"):
            self._sim.progress += 1
        try:
            await self._sim.wait("store", text)
        except BaseException:
            op.close()
            raise
        try:
            result = await op
        except LeaseLost:
            self._sim.count("lease_lost")
            await self._sim.answer(f"{text} -> LeaseLost")
            raise
        await self._sim.answer(f"{text} -> {_outcome(result)}")
        return result

    def _who(self, session_id: str) -> str:
        return self._sim.who(session_id)

    async def create_session(self, record: SessionRecord) -> None:
        await self._call("create_session", self._inner.create_session(record))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        op = self._inner.get_session(session_id)
        return await self._call(f"get_session {self._who(session_id)}", op)

    async def end_session(self, session_id: str) -> None:
        op = self._inner.end_session(session_id)
        await self._call(f"end_session {self._who(session_id)}", op)

    async def ended(self, session_id: str) -> bool:
        return await self._call(f"ended {self._who(session_id)}", self._inner.ended(session_id))

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        op = self._inner.append_event(session_id, seq, data)
        await self._call(f"append_event {self._who(session_id)} seq {seq}", op)

    async def events_after(
        self, session_id: str, seq: int, *, lease: Lease | None = None
    ) -> list[bytes] | None:
        op = self._inner.events_after(session_id, seq, lease=lease)
        return await self._call(f"events_after {self._who(session_id)} {seq}", op)

    async def trim_events(self, session_id: str, upto_seq: int) -> None:
        op = self._inner.trim_events(session_id, upto_seq)
        await self._call(f"trim_events {self._who(session_id)} <= {upto_seq}", op)

    async def save_call(self, session_id: str, call: Call) -> None:
        op = self._inner.save_call(session_id, msgspec.structs.replace(call))
        await self._call(f"save_call {self._who(session_id)}", op)

    async def load_calls(self, session_id: str) -> list[Call]:
        op = self._inner.load_calls(session_id)
        return await self._call(f"load_calls {self._who(session_id)}", op)

    async def ping(self) -> None:
        await self._call("ping", self._inner.ping())

    async def acquire(self, session_id: str, node: str, *, ttl: float) -> Lease:
        self._sim.count("acquires")
        op = self._inner.acquire(session_id, node, ttl=ttl)
        return await self._call(f"acquire {self._who(session_id)}", op)

    async def renew(self, session_id: str, lease: Lease, *, ttl: float) -> bool:
        op = self._inner.renew(session_id, lease, ttl=ttl)
        return await self._call(f"renew {self._who(session_id)} fence {lease.fence}", op)

    async def renew_many(self, leases: Sequence[tuple[str, Lease]], *, ttl: float) -> list[bool]:
        which = ", ".join(f"{self._who(s)} fence {lease.fence}" for s, lease in leases)
        return await self._call(f"renew_many [{which}]", self._inner.renew_many(leases, ttl=ttl))

    async def release(self, session_id: str, lease: Lease) -> None:
        op = self._inner.release(session_id, lease)
        await self._call(f"release {self._who(session_id)}", op)

    async def owner(self, session_id: str) -> str | None:
        return await self._call(f"owner {self._who(session_id)}", self._inner.owner(session_id))

    async def commit(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        state: bytes | None,
        events: Sequence[tuple[int, bytes]],
        calls: Sequence[Call] = (),
        history_drop: int = 0,
        history: Sequence[bytes] = (),
        posts_taken: int = 0,
    ) -> None:
        seqs = [seq for seq, _ in events]
        label = f"commit {self._who(session_id)}"
        label += f" seq {seqs[0]}-{seqs[-1]}" if seqs else " no events"
        if state is not None:
            label += f" +state@{decode_state(state).seq}"
        if calls:
            label += f" +{len(calls)} calls"
        if posts_taken:
            label += f" -{posts_taken} posts"
        label += f" fence {lease.fence if lease else '-'}"
        # The core goes on changing its calls while the commit waits: the write carries
        # them as they are now, as Redis's, encoded when the call is made, does.
        calls = [msgspec.structs.replace(call) for call in calls]
        op = self._inner.commit(
            session_id,
            lease,
            state=state,
            events=events,
            calls=calls,
            history_drop=history_drop,
            history=history,
            posts_taken=posts_taken,
        )
        try:
            await self._call(label, op)
        except LeaseLost:
            for seq, data in events:  # never to reach a socket (invariant 7)
                self._sim.refused[(self._node, session_id, seq)] = data
            raise

    async def load_state(self, session_id: str) -> bytes | None:
        op = self._inner.load_state(session_id)
        return await self._call(f"load_state {self._who(session_id)}", op)

    async def load_history(self, session_id: str) -> list[bytes]:
        op = self._inner.load_history(session_id)
        return await self._call(f"load_history {self._who(session_id)}", op)

    async def post(self, session_id: str, data: bytes) -> None:
        self._sim.count("posts")
        await self._call(f"post {self._who(session_id)}", self._inner.post(session_id, data))

    async def read_posts(self, session_id: str) -> list[bytes]:
        op = self._inner.read_posts(session_id)
        return await self._call(f"read_posts {self._who(session_id)}", op)

    def listen(self, node: str, wake: Callable[[str], None]) -> AbstractAsyncContextManager[None]:
        # Not a round trip: a subscription, woken when a post lands (at its release).
        return self._inner.listen(node, wake)

    async def put_named(self, name: str, value: bytes, *, ttl: float) -> None:
        # Not scheduled: no session's ownership depends on named values (A2A's).
        await self._inner.put_named(name, value, ttl=ttl)

    async def get_named(self, name: str) -> bytes | None:
        return await self._inner.get_named(name)

    async def aclose(self) -> None:
        """The shared store outlives each node's view of it."""


def _outcome(result: object) -> str:
    """A store call's answer, in a few words for the trace."""
    if result is None:
        return "ok/none"
    if isinstance(result, Lease):
        return f"fence {result.fence}"
    if isinstance(result, bytes):
        return f"state@{decode_state(result).seq}"
    if isinstance(result, list):
        if all(isinstance(item, bool) for item in result):
            return str(result)
        return f"{len(result)} items"
    if isinstance(result, SessionRecord):
        return "found"
    return str(result)


# ---------------------------------------------------------------------- the model


class Tally(msgspec.Struct):
    a: int
    b: int
    tag: str


class Total(msgspec.Struct):
    total: int
    tag: str


class Parcel(msgspec.Struct):
    tag: str


class ParcelStatus(msgspec.Struct):
    tag: str
    status: str


class _Port:
    """How a node's model and tools reach the schedule running now."""

    sim: Sim | None = None

    def current(self) -> Sim:
        assert self.sim is not None, "no schedule is running"
        return self.sim


_AGENTS: dict[str, tuple[Agent, _Port]] = {}
"""Each node's agent, by node name, built once per process (checking its tools' schemas
takes most of a node's start) and serving every schedule, one at a time."""


def _agent(node: str, sim: Sim) -> Agent:
    """The agent of ``node``, its model and tools pointed at ``sim``."""
    if node not in _AGENTS:
        port = _Port()
        agent = Agent(
            name="sim",
            instructions="You are the simulated agent.",
            toolbox=Toolbox([PythonTools(_server_tools(port, node))], [_DEVICE]),
            provider=SimModel(port, node),
        )
        _AGENTS[node] = (agent, port)
    agent, port = _AGENTS[node]
    port.sim = sim
    return agent


def _server_tools(port: _Port, node: str) -> list[ServerTool]:
    """The agent's server tools on ``node``: each run is counted, and ends when the
    scheduler says (on this node, whoever owns the session by then)."""

    @tool(name="tally", timeout=LONG)
    async def tally(query: Tally) -> Total:
        """Add two integers (a sync server tool)."""
        await _tool_run(port.current(), node, "tally", query.tag)
        return Total(total=query.a + query.b, tag=query.tag)

    @tool(name="track", execution="async", timeout=LONG)
    async def track(query: Parcel) -> ParcelStatus:
        """Track a parcel (an async server tool)."""
        await _tool_run(port.current(), node, "track", query.tag)
        return ParcelStatus(tag=query.tag, status="delivered")

    return [tally, track]


async def _tool_run(sim: Sim, node: str, name: str, tag: str) -> None:
    run = ToolRun(node, name, tag, sim.step)
    runs = sim.runs.setdefault((name, tag), [])
    runs.append(run)
    sim.note(f"{node} runs {name} {tag}")
    if len(runs) > 1:
        sim.violate(4, f"{name} {tag} ran {len(runs)} times: {sim.tool_log(tag)}")
    try:
        await sim.wait("tool", f"{node} tool {name} {tag} finishes")
    except asyncio.CancelledError:
        run.ended = f"cancelled at #{sim.step}"
        raise
    run.ended = f"finished at #{sim.step}"
    sim.progress += 1


_DEVICE = ToolDef(
    name="device",
    description="Read a value on the client's device.",
    kind="client",
    input_schema={"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]},
    output_schema={
        "type": "object",
        "properties": {"value": {"type": "string"}},
        "required": ["value"],
    },
    display_name="Device",
    timeout=LONG,
)

_COUNT = re.compile(r"^count (\d+) (\S+)$")
_TALLY = re.compile(r"^tally (\d+) (\d+) (\S+)$")
_TRACK = re.compile(r"^track (\S+)$")
_ASK = re.compile(r"^ask (\S+)$")
_CHUNK = re.compile(r"\S+\s*")


def model_answer(request: ModelRequest) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """What the model says to ``request``, and the tools it calls: a function of the
    request alone (a step run again says the same words), as the scripted model decides:
    the outcomes and notes at the end of the transcript if it ends with some, else the
    last user message."""
    items = request.items
    if items and isinstance(items[-1], ToolOutcome | ContextNote):
        return _answer_outcomes(items), []
    text = next((i.text for i in reversed(items) if isinstance(i, UserTurn)), "")
    if found := _COUNT.match(text):
        words = " ".join(f"w{i}" for i in range(1, int(found[1]) + 1))
        return f"{found[2]}: {words}.", []
    if found := _TALLY.match(text):
        args = {"a": int(found[1]), "b": int(found[2]), "tag": found[3]}
        return f"tallying {found[3]}.", [("tally", args)]
    if found := _TRACK.match(text):
        return "", [("track", {"tag": found[1]})]
    if found := _ASK.match(text):
        return f"asking {found[1]}.", [("device", {"tag": found[1]})]
    return f"no rule for {text!r}.", []


def _answer_outcomes(items: Sequence[Item]) -> str:
    """Every outcome and completion note at the end of the transcript, answered in order
    (the scripted model leaves out a pending outcome whose note follows it; this one says
    both, so that every sentence a test expects is said)."""
    trailing: list[ToolOutcome | ContextNote] = []
    for item in reversed(items):
        if not isinstance(item, ToolOutcome | ContextNote):
            break
        trailing.insert(0, item)
    tags = {
        call.call_id: str(call.args.get("tag"))
        for item in items
        if isinstance(item, AssistantTurn)
        for call in item.calls
    }
    said: list[str] = []
    for item in trailing:
        if isinstance(item, ToolOutcome):
            tag = tags.get(item.call_id, "?")
            if item.error == CANCELLED:
                continue
            if item.error is not None:
                said.append(f"{item.name} {tag} failed: {item.error}.")
            elif item.name == "tally":
                said.append(f"total {item.output['total']} for {tag}.")
            elif item.name == "track" and item.output == PENDING:
                said.append(f"tracking {tag}.")
            elif item.name == "device":
                said.append(f"device said {item.output['value']}.")
            else:
                said.append(f"{item.name} {tag} returned {item.output}.")
            continue
        parsed = parse_completion_note(item.text)
        tag = tags.get(item.call_id or "", "?")
        if parsed is None:
            said.append(f"unreadable note for {tag}.")
        elif parsed[2] is not None:
            said.append(f"tracking {tag} failed: {parsed[2]}.")
        else:
            said.append(f"parcel {tag} is {parsed[1]['status']}.")
    return " ".join(said)


class SimModel:
    """The model of every node: ``model_answer``, streamed word by word, each word (and
    the step's end) waiting for the scheduler."""

    name = "sim"
    capabilities = Capabilities(tools=True, parallel_tool_calls=True)

    def __init__(self, port: _Port, node: str) -> None:
        self._port = port
        self._node = node

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        sim = self._port.current()
        sim.check_request(self._node, request)
        text, calls = model_answer(request)
        chunks = _CHUNK.findall(text)
        about = f"{self._node} model {text[:24]!r}" if text else f"{self._node} model (no text)"
        for index, chunk in enumerate(chunks, start=1):
            await sim.wait("model", f"{about} chunk {index}/{len(chunks)} {chunk!r}")
            yield ModelText(chunk)
        end = f" calls {[name for name, _ in calls]}" if calls else ""
        await sim.wait("model", f"{about} end{end}")
        for name, args in calls:
            yield ModelToolCall(name=name, args=args)
        yield ModelFinish(reason="tool_calls" if calls else "stop")

    async def aclose(self) -> None:
        """Nothing to release."""


# ---------------------------------------------------------------------- sockets


class SimSocket:
    """A client's socket to one node, as the transport sees it (the few members of
    Starlette's ``WebSocket`` that ``_serve`` uses, and a ``FrameWriter`` that hands every
    frame to the checks and the client at once)."""

    def __init__(self, owner: SimClient, node: str, number: int) -> None:
        self.owner = owner
        self.node = node
        self.label = f"s{number}@{node}"
        self.scope: dict[str, Any] = {
            "type": "websocket",
            "subprotocols": [],
            FRAME_WRITER_SCOPE_KEY: self,
        }
        self.client = None  # no address: the transport counts no sockets per address
        self._inbound: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.gone = False
        """Cut, or closed: nothing written reaches the client any more."""

    # What the client does.

    def push(self, msg: ClientMsg) -> None:
        self._inbound.put_nowait({"type": "websocket.receive", "text": encode(msg).decode()})

    def drop(self) -> None:
        """The connection is gone, as a dead TCP connection: no close frame, no more
        writes; the server's receive ends with 1006."""
        if not self.gone:
            self.gone = True
            self._inbound.put_nowait({"type": "websocket.disconnect", "code": 1006})

    # What the transport and its connection use.

    async def accept(self, subprotocol: str | None = None) -> None:
        """Accepted already: the simulated handshake has nothing to negotiate."""

    async def receive(self) -> dict[str, Any]:
        return await self._inbound.get()

    async def send_text(self, data: str) -> None:
        self.write_now([data.encode()])

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        if self.gone:
            return
        self.gone = True
        self.owner.closed(self, code, reason or "")
        # The client answers the close frame: the server's receive ends.
        self._inbound.put_nowait({"type": "websocket.disconnect", "code": code})

    def write_now(self, frames: list[bytes]) -> bool:
        if self.gone:
            raise ConnectionResetError("the peer is gone")
        for data in frames:
            try:
                self.owner.sim.delivered(self, data)
            except Exception as exc:
                # The connection takes any exception for a dead peer: a bug of the
                # harness must not pass for one.
                self.owner.sim.harness_failed(exc)
        return True

    async def write(self, frames: list[bytes]) -> None:
        self.write_now(frames)


# ---------------------------------------------------------------------- clients


@dataclass
class Message:
    msg_id: str
    text: str
    expected: list[str]
    """The sentences its answer says, each exactly once."""
    optional: list[str] = field(default_factory=list)
    """Sentences said at most once: an async result's, which the model says only when the
    note of it ends the transcript (the scripted model's rule), not when a user message
    follows it; that the note reached the model once is checked in the transcript."""
    responses: list[str] = field(default_factory=list)


@dataclass
class Response:
    response_id: str
    origin: str
    deltas: list[tuple[str, int, str]] = field(default_factory=list)
    """(node, seq, delta) of the step streaming."""
    said: list[str] = field(default_factory=list)
    status: str | None = None


_TERMINAL = ("completed", "failed", "cancelled", "expired")
_SENTENCE = re.compile(r"[^.]+\.")


class SimClient:
    """One conversation's client, doing what the shipped SDK does: ``last_seq``, the outbox
    resent after a resume, client functions answered once, acks."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.sim = sim
        self.name = name
        self.session_id: str | None = None
        self._token = ""
        self.socket: SimSocket | None = None
        self.state: Literal["starting", "resuming", "live", "down"] = "down"
        self.last_seq = 0
        self.acked = 0
        self.messages: dict[str, Message] = {}
        self.responses: dict[str, Response] = {}
        self.unconfirmed: dict[str, UserMessage] = {}
        """User messages until a response to them starts (the SDK's outbox)."""
        self.results: dict[str, ToolResult] = {}
        """Results until a ``tool.status`` for their call (the SDK's outbox)."""
        self.calls: dict[str, str] = {}
        """Client calls offered: call id -> tag."""
        self.answered: set[str] = set()
        self.server_calls: dict[str, str] = {}
        """Server tool calls seen in ``tool.status``: call id -> tool."""
        self.statuses: dict[str, list[str]] = {}
        """Each call's statuses, not counting duplicates."""
        self._replay_end: int | None = None
        self._missing_open: set[str] = set()

    @property
    def live(self) -> bool:
        return self.state == "live"

    def socket_label(self) -> str:
        return self.socket.label if self.socket else "-"

    # ------------------------------------------------------------------ actions

    def _open(self, node: Node) -> SimSocket:
        self.sim.count("sockets")
        socket = self.socket = SimSocket(self, node.name, self.sim.stats["sockets"])
        websocket = cast(WebSocket, socket)  # the members _serve uses (see SimSocket)
        work = _serve(node.runtime, websocket, ANONYMOUS, SUBPROTOCOL)
        self.sim.spawn(work, f"sim:socket:{socket.label}", node.name)
        return socket

    def start(self, node: Node) -> str:
        self.state = "starting"
        self._open(node).push(SessionStart())
        return node.name

    def resume(self, node: Node) -> None:
        assert self.session_id is not None
        self.sim.count("resumes")
        self.state = "resuming"
        self._open(node).push(
            SessionResume(
                session_id=self.session_id, resume_token=self._token, last_seq=self.last_seq
            )
        )

    def cut(self) -> None:
        assert self.socket is not None
        self.sim.count("cuts")
        self.socket.drop()
        self.socket, self.state = None, "down"

    def may_send(self) -> bool:
        open_ = [m for m in self.messages.values() if not self._answered(m)]
        return len(open_) < _MAX_OUTSTANDING

    def _answered(self, msg: Message) -> bool:
        return any(self.responses[r].status is not None for r in msg.responses)

    def send_message(self) -> None:
        rng = self.sim.rng
        tag = f"{self.name}m{len(self.messages) + 1}"
        kind = rng.choices(("count", "tally", "track", "ask"), weights=(4, 1.5, 1.5, 1.5))[0]
        optional: list[str] = []
        if kind == "count":
            n = rng.randint(2, 6)
            words = " ".join(f"w{i}" for i in range(1, n + 1))
            text, expected = f"count {n} {tag}", [f"{tag}: {words}."]
        elif kind == "tally":
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            text, expected = (
                f"tally {a} {b} {tag}",
                [f"tallying {tag}.", f"total {a + b} for {tag}."],
            )
        elif kind == "track":
            text, expected = f"track {tag}", [f"tracking {tag}."]
            optional = [f"parcel {tag} is delivered."]
        else:
            text, expected = f"ask {tag}", [f"asking {tag}.", f"device said v-{tag}."]
        self.sim.act(f"{self.name} says {text!r} (id {tag}) on {self.socket_label()}")
        self.messages[tag] = Message(tag, text, expected, optional)
        msg = UserMessage(text=text, id=tag)
        self.unconfirmed[tag] = msg
        self._push(msg)

    def answerable(self) -> list[str]:
        return [c for c in self.calls if c not in self.answered and self._settled(c) is None]

    def answer_a_call(self) -> None:
        call_id = self.sim.rng.choice(self.answerable())
        tag = self.calls[call_id]
        self.sim.act(f"{self.name} answers {call_id} (device {tag}) on {self.socket_label()}")
        result = ToolResult(call_id=call_id, tool="device", output={"value": f"v-{tag}"})
        self.answered.add(call_id)
        self.results[call_id] = result
        self._push(ToolResults(results=[result]))

    def ack(self) -> None:
        self.acked = self.last_seq
        self._push(Ack(seq=self.last_seq))

    def _push(self, msg: ClientMsg) -> None:
        assert self.socket is not None
        self.socket.push(msg)

    # ------------------------------------------------------------------ frames

    def closed(self, socket: SimSocket, code: int, reason: str) -> None:
        """The node closed ``socket``."""
        if socket is not self.socket:
            return
        self.sim.note(f"{self.name} <- {socket.node} close {code} {reason!r}")
        self.socket, self.state = None, "down"
        if code not in (CloseCode.SERVICE_RESTART, CloseCode.TRY_AGAIN):
            self.sim.violate(
                0, f"{socket.node} closed {self.name}'s {socket.label} with {code} {reason!r}"
            )

    def receive(self, socket: SimSocket, msg: Outbound) -> None:
        sim = self.sim
        sim.note(f"{self.name} <- {socket.node} {describe(msg)}")
        if msg.seq:
            if msg.seq <= self.last_seq:
                sim.violate(
                    2,
                    f"{self.name} got seq {msg.seq} again from {socket.node}"
                    f" (it has {self.last_seq}): {describe(msg)}",
                )
                return
            if msg.seq != self.last_seq + 1:
                sim.violate(
                    2,
                    f"{self.name} got seq {msg.seq} from {socket.node} after {self.last_seq}:"
                    " a hole",
                )
            self.last_seq = msg.seq
        self._apply(socket, msg)
        if self._replay_end is not None and self.last_seq >= self._replay_end:
            self._replay_done(socket)

    def _apply(self, socket: SimSocket, msg: Outbound) -> None:
        match msg:
            case SessionCreated(session_id=session_id, resume_token=token):
                self.session_id, self._token, self.state = session_id, token, "live"
                self.sim.names[session_id] = self.name
            case SessionResumed():
                self._resumed(socket, msg)
            case SessionSnapshot():
                self.sim.violate(
                    2, f"{self.name} got a snapshot from {socket.node}: it must rebuild"
                )
                self.last_seq, self.state = msg.last_seq, "live"
            case ResponseCreated(response_id=rid, in_reply_to=msg_id, call_id=call_id):
                origin = msg_id or f"the result of {call_id}"
                self.responses[rid] = Response(rid, origin)
                if msg_id is not None:
                    self.unconfirmed.pop(msg_id, None)
                    message = self.messages[msg_id]
                    message.responses.append(rid)
                    if len(message.responses) > 1:
                        self.sim.violate(
                            3, f"{msg_id} got a second response {rid}: {message.responses}"
                        )
            case TextDelta(response_id=rid, delta=delta):
                self.responses[rid].deltas.append((socket.node, msg.seq, delta))
            case TextDone(response_id=rid, text=text):
                self._step_done(self.responses[rid], text)
            case ToolCalls(calls=calls):
                for call in calls:
                    self.calls[call.call_id] = str(call.args.get("tag"))
            case ToolStatus():
                self._status(msg)
            case ResponseDone(response_id=rid, status=status):
                response = self.responses[rid]
                response.status = status
                if status != "completed":
                    self.sim.violate(3, f"response {rid} to {response.origin} ended {status}")
            case Error(code=code, message=text):
                invariant = {"resume_gap": 2, "response_interrupted": 3, "tool_timeout": 5}.get(
                    code, 0
                )
                self.sim.violate(
                    invariant, f"{self.name} got error {code} from {socket.node}: {text}"
                )

    def _resumed(self, socket: SimSocket, msg: SessionResumed) -> None:
        if msg.replayed_from != self.last_seq + 1:
            self.sim.violate(
                2,
                f"{socket.node} replays from {msg.replayed_from}, {self.name} has {self.last_seq}",
            )
        self.state = "live"
        offered = {call.call_id for call in msg.open_calls}
        for call in msg.open_calls:
            self.calls.setdefault(call.call_id, str(call.args.get("tag")))
        # A call the client has not answered must be offered again, unless the replay
        # settles it (checked once the replay is over).
        self._missing_open = {c for c in self.answerable() if c not in offered}
        self._replay_end = msg.last_seq
        # The SDK's outbox, in its order: results, then user messages.
        if self.results:
            self._push(ToolResults(results=list(self.results.values())))
        for unsent in self.unconfirmed.values():
            self._push(unsent)
        if self.last_seq >= msg.last_seq:
            self._replay_done(socket)

    def _replay_done(self, socket: SimSocket) -> None:
        self._replay_end = None
        for call_id in sorted(self._missing_open):
            if self._settled(call_id) is None:
                self.sim.violate(
                    6, f"{socket.node} did not offer the open call {call_id} again to {self.name}"
                )
        self._missing_open = set()

    def _step_done(self, response: Response, text: str) -> None:
        streamed = "".join(delta for _, _, delta in response.deltas)
        if streamed != text:
            parts = " | ".join(f"{node}#{seq} {delta!r}" for node, seq, delta in response.deltas)
            self.sim.violate(
                3,
                f"response {response.response_id} to {response.origin}: the deltas say"
                f" {streamed!r}, text.done says {text!r} (deltas: {parts})",
            )
        response.said.append(text)
        response.deltas = []

    def _status(self, msg: ToolStatus) -> None:
        call_id = msg.call_id
        if msg.tool != "device":
            self.server_calls[call_id] = msg.tool
        self.results.pop(call_id, None)
        if msg.duplicate:
            return
        statuses = self.statuses.setdefault(call_id, [])
        statuses.append(msg.status)
        invariant = {"track": 5, "device": 6}.get(msg.tool, 4)
        if msg.status in _TERMINAL and msg.status != "completed":
            self.sim.violate(invariant, f"{msg.tool} {call_id} ended {msg.status}: {msg.error}")
        if statuses.count("completed") > 1:
            self.sim.violate(
                invariant, f"{msg.tool} {call_id} completed {statuses.count('completed')} times"
            )

    def _settled(self, call_id: str) -> str | None:
        return next((s for s in self.statuses.get(call_id, ()) if s in _TERMINAL), None)

    # ------------------------------------------------------------------ the end

    def final_checks(self) -> None:
        sim, name = self.sim, self.name
        if self.session_id is None:
            sim.violate(0, f"{name} never got its session")
            return
        if not self.live:
            sim.violate(0, f"{name} is not connected at the end ({self.state})")
        owner = _run_now(sim.inner.owner(self.session_id))
        driver = sim.node(owner).runtime.drivers.get(self.session_id) if owner else None
        if owner is None or driver is None:
            sim.violate(0, f"no node drives {name}'s session at the end (lease: {owner})")
            return
        head = driver.session.last_seq
        if head != self.last_seq:
            sim.violate(2, f"{name} has seq {self.last_seq}, its session on {owner} is at {head}")
        self._check_answers()
        self._check_calls(driver.session.state(), owner)

    def _check_answers(self) -> None:
        """Every message answered once, every sentence of the answers said once."""
        sim, name = self.sim, self.name
        said = [
            sentence.strip()
            for response in self.responses.values()
            for text in response.said
            for sentence in _SENTENCE.findall(text)
        ]
        for msg in self.messages.values():
            if not self._answered(msg):
                sim.violate(3, f"{name}: {msg.msg_id} {msg.text!r} never answered")
            for sentence in msg.expected + msg.optional:
                times = said.count(sentence)
                if times > 1 or (times == 0 and sentence in msg.expected):
                    sim.violate(
                        3,
                        f"{name}: {sentence!r} said {times} times"
                        f" (tools of {msg.msg_id}: {sim.tool_log(msg.msg_id)})",
                    )
        known = {s for msg in self.messages.values() for s in msg.expected + msg.optional}
        for sentence in sorted(set(said) - known):
            sim.violate(3, f"{name}: unexpected {sentence!r}")

    def _check_calls(self, state: SessionState, owner: str) -> None:
        """Every call settled once; every async result in the transcript once."""
        sim, name = self.sim, self.name
        notes = [item.call_id for item in state.history if isinstance(item, ContextNote)]
        notes += [pending.note.call_id for pending in state.notes]
        for call_id, tool_name in sorted(self.server_calls.items()):
            done = self.statuses.get(call_id, []).count("completed")
            if done != 1:
                invariant = 5 if tool_name == "track" else 4
                sim.violate(invariant, f"{name}: {tool_name} {call_id} completed {done} times")
            if tool_name == "track" and notes.count(call_id) != 1:
                sim.violate(
                    5,
                    f"{name}: the transcript on {owner} (the owner) holds the note of track"
                    f" {call_id} {notes.count(call_id)} times: the model sees it so often",
                )
        for call_id in sorted(self.calls):
            done = self.statuses.get(call_id, []).count("completed")
            if done != 1:
                sim.violate(6, f"{name}: device {call_id} completed {done} times")


def describe(msg: Outbound) -> str:
    """An event in a few words, for the trace."""
    kind = type(msg).__struct_config__.tag
    head = f"seq {msg.seq} {kind}" if msg.seq else str(kind)
    match msg:
        case TextDelta(delta=delta):
            return f"{head} {delta!r}"
        case TextDone(text=text):
            return f"{head} {text!r}"
        case ResponseCreated(response_id=rid, in_reply_to=msg_id, call_id=call_id):
            return f"{head} {rid} for {msg_id or call_id}"
        case ResponseDone(response_id=rid, status=status):
            return f"{head} {rid} {status}"
        case ToolCalls(calls=calls):
            return f"{head} {[c.call_id for c in calls]}"
        case ToolStatus(call_id=call_id, tool=name, status=status):
            return f"{head} {name} {call_id} {status}{' duplicate' if msg.duplicate else ''}"
        case Error(code=code, message=text):
            return f"{head} {code}: {text}"
        case SessionResumed(replayed_from=start, last_seq=last, open_calls=calls):
            return f"{head} replay {start}..{last}, open {[c.call_id for c in calls]}"
    return head


# ---------------------------------------------------------------------- entry point


def run_schedule(seed: int, *, keep_going: bool = False) -> Outcome:
    """Run the schedule of ``seed`` (100 to 250 actions, then the drain) in a loop of its
    own; the same seed gives the same trace. It stops after the action that broke an
    invariant, unless ``keep_going``."""
    sim = Sim(seed, keep_going=keep_going)
    actions = sim.rng.randint(100, 250)
    logs = (structlog.contextvars.merge_contextvars, sim.log_line)
    with (
        mock.patch.object(gateway.shell.runtime, "new_id", sim.new_id),
        structlog.testing.capture_logs(processors=logs),
        asyncio.Runner(loop_factory=VirtualLoop) as runner,
    ):
        runner.run(sim.run(actions))
    return Outcome(seed, sim.violations, sim.trace, sim.stats)

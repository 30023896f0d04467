"""The multi-node torture: unpaced conversations whose sockets are cut at every kind of
moment, each resume sent through a round-robin balancer to whichever node it lands on.

Every conversation is the shipped Python SDK (``client_sdk.Conversation``; a subclass
only adds a hook after each send, to cut the socket right after a ``user.message`` or a
``tool.results``). It takes turns with no pause, cycling through a counting answer of up
to 24 words, a client function, a sync server tool (``tally``) and an async one
(``order``, which finishes by itself), and checks strictly what it got:

- every ``seq`` once and in order (the SDK drops a repeat; a hole, a ``resume_gap`` or a
  snapshot is a problem), and no ``response_interrupted``;
- every answer exactly its expected text, and each response's deltas exactly its
  ``text.done`` (no text sent twice, none missing);
- every server tool run once per call (the tools write a line per run, on any node);
- every async result delivered once: one completion response per ``order`` call.

The only loss tolerated is the documented one: a server tool that was running on a node
SIGKILLed fails at its deadline, saying so (``LOST``), which counts as delivered.

A cutter per conversation waits about ``cut_every`` seconds (exponentially distributed),
arms one of the moments below, and cuts the socket (no close frame) when it comes.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_sdk import Conversation
from client_sdk.exceptions import ClientError
from gateway.wire.v1 import (
    Error,
    Outbound,
    ResponseCreated,
    SessionResumed,
    SessionSnapshot,
    TextDelta,
    TextDone,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.data.cluster_tools import pids_file

__all__ = ["LOST", "MOMENTS", "Churn", "ChurnReport"]

LOST = (
    "tool_timeout: the tool was running on another gateway node when this session moved"
    " (that node stopped or let the session go) and its outcome did not arrive in time;"
    " it is not run again"
)
"""The reason a server tool left on a killed node fails with (gateway/dispatch.py)."""

MOMENTS = ("after_message", "mid_stream", "call_open", "after_results", "in_replay", "any")
"""Where a cut lands: right after a ``user.message`` is sent; after a few deltas of an
answer; while a client function runs; right after its ``tool.results`` is sent; right
after ``session.resumed`` (during the replay); wherever the conversation is."""

_COMPLETION = re.compile(r"order (\S+) (?:is shipped|failed: (.*?))(?= order \S+ (?:is|failed)|$)")
"""An async result as the model says it (several may share one text)."""
TURN_TIMEOUT = 30.0
"""Seconds one turn may take, resumes included, before it counts as a problem."""
SETTLE_TIMEOUT = 30.0
"""Seconds a conversation waits at the end for its async results still due."""


class _CuttableConversation(Conversation):
    """The shipped SDK, with a hook called after every message it sends."""

    after_send: Callable[[object], None] | None = None

    async def _send(self, msg: Any) -> None:
        await super()._send(msg)
        if self.after_send is not None:
            self.after_send(msg)


def cut(conv: Conversation) -> bool:
    """Drop the SDK's socket the hard way (no close frame), as a phone losing signal."""
    ws = conv._ws
    if ws is None or conv.session is None:
        return False
    transport = ws.transport
    if transport.is_closing():
        return False
    transport.abort()
    return True


@dataclass
class ChurnReport:
    """What a run did and every problem it found (empty: the guarantees held)."""

    sessions: int = 0
    turns: int = 0
    cuts: int = 0
    resumes: int = 0
    tools: int = 0
    async_results: int = 0
    lost_with_a_node: int = 0
    seconds: float = 0.0
    """From the first conversation's start to the last one's end."""
    problems: list[str] = field(default_factory=list)

    def kinds(self) -> Counter[str]:
        return Counter(problem.split(":", 1)[0] for problem in self.problems)

    def summary(self) -> str:
        return (
            f"{self.sessions} sessions, {self.seconds:.0f} s, {self.turns} turns,"
            f" {self.cuts} socket cuts,"
            f" {self.resumes} resumes, {self.tools} server tools, {self.async_results}"
            f" async results, {self.lost_with_a_node} lost with a killed node,"
            f" {len(self.problems)} problems {dict(self.kinds())}"
        )


class _Talk:
    """One conversation: its turns, its cutter, and the strict checks of what it saw."""

    def __init__(self, churn: Churn, index: int, conv: _CuttableConversation) -> None:
        self.churn = churn
        self.index = index
        self.conv = conv
        self.rng = random.Random(churn.seed * 100_003 + index)
        self.armed: str | None = None
        self.deltas_seen = 0
        self.last_seq = 0
        self.texts: dict[str, list[str]] = {}
        """Deltas by response id."""
        self.completions: Counter[str] = Counter()
        """Completion texts of async calls (``order <tag> is ...``), counted."""
        self.orders: list[str] = []
        """Tags of the ``order`` calls the model answered ``looking up`` to."""
        self.call_tool: dict[str, str] = {}
        self.completed: Counter[str] = Counter()
        """``tool.status completed`` by call id."""
        self.changed = asyncio.Event()
        conv.after_send = self._sent

    def problem(self, text: str) -> None:
        self.churn.report.problems.append(f"{text} (conversation {self.index})")

    # ---------------------------------------------------------------- cutting

    def _cut(self) -> None:
        self.armed = None
        if cut(self.conv):
            self.churn.report.cuts += 1

    def _sent(self, msg: object) -> None:
        if self.armed == "after_message" and isinstance(msg, UserMessage):
            self._cut()
        elif self.armed == "after_results" and isinstance(msg, ToolResults):
            self._cut()

    async def cutter(self) -> None:
        """Cut about every ``cut_every`` seconds, at an armed moment (or anywhere, if it
        does not come within a second)."""
        loop = asyncio.get_running_loop()
        while loop.time() < self.churn.deadline:
            await asyncio.sleep(self.rng.expovariate(1 / self.churn.cut_every))  # pacing chaos
            self.armed = self.rng.choice(MOMENTS)
            self.deltas_seen = 0
            if self.armed == "any":
                self._cut()
                continue
            await asyncio.sleep(1.0)  # the moment did not come: cut wherever we are
            if self.armed is not None and loop.time() < self.churn.deadline:
                self._cut()

    # ---------------------------------------------------------------- checking

    async def record(self) -> None:
        """Check every event the SDK delivers, as it comes."""
        try:
            async for event in self.conv.events():
                self._check(event)
                self.changed.set()
        except ClientError:
            pass  # the conversation closed

    def _check(self, event: Outbound) -> None:
        seq = getattr(event, "seq", 0) or 0
        if seq:
            if seq != self.last_seq + 1:
                self.problem(f"seq_out_of_order: {seq} after {self.last_seq}")
            self.last_seq = max(self.last_seq, seq)
        match event:
            case SessionResumed():
                if self.armed == "in_replay":
                    self._cut()
            case SessionSnapshot():
                self.problem(f"snapshot: resumed with a snapshot at seq {event.last_seq}")
                self.last_seq = event.last_seq
            case Error(code=code, message=message) if code in (
                "resume_gap",
                "response_interrupted",
                "store_unavailable",
            ):
                self.problem(f"{code}: {message}")
            case ResponseCreated():
                self.texts[event.response_id] = []
            case TextDelta(response_id=response_id, delta=delta):
                self.texts.setdefault(response_id, []).append(delta)
                self.deltas_seen += 1
                if self.armed == "mid_stream" and self.deltas_seen >= 3:
                    self._cut()
            case TextDone(response_id=response_id, text=text):
                streamed = "".join(self.texts.pop(response_id, []))
                if streamed != text:
                    self.problem(f"text_mismatch: deltas {streamed!r}, text.done {text!r}")
                self.texts[response_id] = []
                for match in _COMPLETION.finditer(text):
                    self.completions[match[1]] += 1
                    if match[2] == LOST:
                        self.churn.lost(f"order {match[1]}")
            case ToolStatus(call_id=call_id, tool=tool, status=status):
                self.call_tool[call_id] = tool
                if status == "completed" and not event.duplicate:
                    self.completed[call_id] += 1
                    if self.completed[call_id] > 1:
                        self.problem(f"completed_twice: {tool} call {call_id}")
            case _:
                pass

    # ---------------------------------------------------------------- talking

    async def device(self, tag: str) -> dict[str, str]:
        if self.armed == "call_open":
            self._cut()
        return {"value": f"v-{tag}"}

    def turn(self, number: int) -> tuple[str, str]:
        """What the user says in turn ``number``, and the exact answer expected."""
        tag = f"s{self.index}t{number}"
        kind = number % 4
        if kind == 0:
            words = " ".join(f"w{i}" for i in range(1, 1 + self.rng.randint(1, 24)))
            return f"echo {tag}: {words}.", f"{tag}: {words}."
        if kind == 1:
            return f"ask {tag}", f"asking device said v-{tag}"
        if kind == 2:
            return f"tally {self.index} {number} {tag}", f"total {self.index + number} for {tag}"
        return f"order {tag}", f"looking up {tag}"

    async def talk(self) -> None:
        loop = asyncio.get_running_loop()
        report = self.churn.report
        number = 0
        while loop.time() < self.churn.deadline:
            number += 1
            said, expected = self.turn(number)
            try:
                async with asyncio.timeout(TURN_TIMEOUT):
                    got = "".join([delta async for delta in self.conv.say(said)])
            except TimeoutError:
                self.problem(f"no_answer: {said!r} within {TURN_TIMEOUT} s")
                return
            except ClientError as exc:
                self.problem(f"turn_failed: {said!r}: {type(exc).__name__}: {exc}")
                continue
            report.turns += 1
            if said.startswith("tally") and got == f"tally failed: {LOST}":
                self.churn.lost(f"tally {said.split()[-1]}")
            elif got != expected:
                self.problem(f"wrong_answer: said {said!r}, expected {expected!r}, got {got!r}")
            elif said.startswith("order"):
                tag = said.split()[1]
                self.orders.append(tag)
                # The user waits for the result (the scripted model would answer the
                # completion instead of a message sent meanwhile): on an event, no clock.
                await self._completed(tag)

    async def _completed(self, tag: str) -> None:
        try:
            async with asyncio.timeout(TURN_TIMEOUT):
                while self.completions[tag] == 0:
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            self.problem(f"no_async_result: order {tag} within {TURN_TIMEOUT} s")

    async def settle(self) -> None:
        """Wait for every async result still due, then check each came once."""
        try:
            async with asyncio.timeout(SETTLE_TIMEOUT):
                while any(self.completions[tag] == 0 for tag in self.orders):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            pass
        for tag in self.orders:
            count = self.completions[tag]
            if count != 1:
                self.problem(f"async_result_{'lost' if count == 0 else 'twice'}: order {tag}")
        self.churn.report.async_results += sum(self.completions.values())


class Churn:
    """``sessions`` conversations through ``url`` until ``seconds`` from now.

    Args:
        url: the balancer's ``ws://`` URL of ``/v1/realtime``.
        runs: the file the tools write a line to per run, on any node
            (tests/data/cluster_tools.py).
        cut_every: mean seconds between two cuts of one conversation's socket.
    """

    def __init__(
        self,
        url: str,
        runs: Path,
        *,
        sessions: int,
        seconds: float,
        cut_every: float = 4.0,
        seed: int = 1,
    ) -> None:
        self.url = url
        self.runs = runs
        self.sessions = sessions
        self.seconds = seconds
        self.cut_every = cut_every
        self.seed = seed
        self.deadline = 0.0
        self.report = ChurnReport(sessions=sessions)
        self.killed: set[int] = set()
        """The pids of the nodes a chaos task killed (it adds them)."""
        self._lost: list[str] = []
        """The tool runs (``tally <tag>``) whose call failed as left on a killed node."""

    def lost(self, run: str) -> None:
        """A call failed as left on a killed node: tolerated if that node was killed."""
        self._lost.append(run)
        self.report.lost_with_a_node += 1

    async def run(self, chaos: Callable[[float], Awaitable[None]] | None = None) -> ChurnReport:
        """Run the conversations, and ``chaos`` alongside (a node killer, given the
        deadline); return what they found."""
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + self.seconds
        talks = [self._conversation(i) for i in range(self.sessions)]
        extra = [chaos(self.deadline)] if chaos is not None else []
        started = loop.time()
        async with asyncio.timeout(self.seconds + TURN_TIMEOUT + SETTLE_TIMEOUT + 30):
            await asyncio.gather(*talks, *extra)
        self.report.seconds = loop.time() - started
        self._check_runs()
        return self.report

    async def _conversation(self, index: int) -> None:
        await asyncio.sleep(index * 0.01)  # start over a few seconds, not in one burst
        conv = _CuttableConversation(self.url, max_reconnect_delay=0.5)
        talk = _Talk(self, index, conv)
        conv.client_function("device")(talk.device)
        async with conv:
            recorder = asyncio.create_task(talk.record())
            await asyncio.sleep(0)  # subscribed before the session starts
            cutter = asyncio.create_task(talk.cutter())
            try:
                await talk.talk()
                cutter.cancel()
                await talk.settle()
            finally:
                cutter.cancel()
                self.report.resumes += conv.reconnects
                recorder.cancel()

    def _check_runs(self) -> None:
        runs = Counter(self.runs.read_text().splitlines())
        self.report.tools = sum(runs.values())
        for line, count in runs.items():
            if count > 1:
                self.report.problems.append(f"tool_run_twice: {line} ran {count} times")
        ran_in: dict[str, int] = {}
        for line in pids_file(self.runs).read_text().splitlines():
            run, _, ran_by = line.rpartition("\t")
            ran_in[run] = int(ran_by)
        for lost in self._lost:
            node = ran_in.get(lost)  # none: its node died before the tool began
            if node is not None and node not in self.killed:
                self.report.problems.append(
                    f"lost_on_a_live_node: {lost} ran on pid {node}, never killed, and its"
                    " call failed as if its node had died"
                )

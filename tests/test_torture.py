"""Disconnect torture: hundreds of drops at random points, and nothing lost or done twice.

The same conversation runs once without drops and then again and again with
the socket cut at random points (during deltas, with client calls open, with
async tools pending, during replay itself), with a fixed seed. The client is the
shipped Python SDK; a proxy between it and the gateway cuts the connections the
hard way (no close frame), as a lost network does. After every
resume the client's rebuilt transcript must equal the uninterrupted one, every
server tool must have run once per call, and every client result must have
been applied once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial

from client_sdk import Conversation, SessionClosed, connect
from gateway.wire.v1 import (
    Outbound,
    ResponseCreated,
    ResponseDone,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolStatus,
)
from tests.data import tools as test_tools
from tests.proxy import Proxy, proxy_to
from tests.support import Gateway, serving

SEED = 20261129
RUNS = 10
DROP_CHANCE = 0.2
SCRIPT: list[tuple[str, str]] = [
    ("say", "echo alpha beta gamma delta epsilon"),
    ("say", "one"),
    ("say", "order 11"),
    ("say", "two"),
    ("release", "11"),
    ("say", "add 4 5"),
    ("say", "echo " + " ".join(f"word{i}" for i in range(40))),
    ("say", "orders 21 22"),
    ("release", "22"),
    ("release", "21"),
    ("say", "order_and_a 31"),
    ("release", "31"),
    ("say", "echo the end"),
]
TERMINAL = {"completed", "failed", "cancelled", "expired"}


@dataclass
class Run:
    """One conversation through the shipped SDK; the proxy cuts the socket at random events."""

    conv: Conversation
    proxy: Proxy
    rng: random.Random
    chance: float
    events: list[Outbound] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)
    """How often each client function ran (once per call: results are resent, not re-run)."""
    drops: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def record(self, stream: AsyncIterator[Outbound]) -> None:
        with contextlib.suppress(SessionClosed):
            async for event in stream:
                self.events.append(event)
                self._changed.set()
                if self.chance and self.rng.random() < self.chance:
                    self.drops += self.proxy.drop()  # during deltas, calls, replay...

    async def until(self, found: Callable[[Outbound], bool], start: int) -> int:
        """The index of the first event from ``start`` on that ``found`` accepts."""
        async with asyncio.timeout(30):
            while True:
                for index in range(start, len(self.events)):
                    if found(self.events[index]):
                        return index
                start = len(self.events)
                self._changed.clear()
                await self._changed.wait()


def answers(msg_id: str | None, event: Outbound) -> bool:
    """Whether ``event`` starts the response to that message (``None``: to an async result)."""
    if not isinstance(event, ResponseCreated):
        return False
    return event.in_reply_to == msg_id if msg_id else event.call_id is not None


def ends(response_id: str, event: Outbound) -> bool:
    return isinstance(event, ResponseDone) and event.response_id == response_id


async def converse(gateway: Gateway, rng: random.Random, chance: float) -> Run:
    async with proxy_to(gateway.port) as proxy:
        conv = connect(proxy.url(), max_reconnect_delay=0.2)
        run = Run(conv, proxy, rng, chance)

        def device(tool: str, value: str) -> Callable[[], dict[str, str]]:
            def answer() -> dict[str, str]:
                run.runs[tool] += 1
                return {"value": value}

            return answer

        async with conv:
            conv.add_client_function(device("device_a", "a"), name="device_a")
            conv.add_client_function(device("device_b", "b"), name="device_b")
            recorder = asyncio.create_task(run.record(conv.events()))
            await conv.start()
            for action, text in SCRIPT:
                start = len(run.events)
                if action == "say":
                    msg_id = await conv.post(text)  # a message lost in a drop is resent
                    index = await run.until(partial(answers, msg_id), start)
                else:
                    test_tools.gate(f"order:{text}").set()
                    index = await run.until(partial(answers, None), start)
                created = run.events[index]
                assert isinstance(created, ResponseCreated)
                await run.until(partial(ends, created.response_id), index)
            run.chance = 0.0
        await recorder
    return run


def transcript(events: list[Outbound]) -> list[tuple[str, ...]]:
    """What a user-facing app shows, without the random ids."""
    lines: list[tuple[str, ...]] = []
    for event in events:
        match event:
            case ResponseCreated():
                lines.append(("response", "user" if event.in_reply_to else "async result"))
            case TextDone(text=text):
                lines.append(("says", text))
            case ToolStatus(duplicate=False) if event.status in TERMINAL | {"pending"}:
                lines.append(("tool", event.tool, event.status))
            case ResponseDone(status=status):
                lines.append(("done", status))
    return lines


def check_stream(events: list[Outbound]) -> None:
    """Each response's deltas add up to its text.done, exactly once each."""
    deltas: dict[str, list[str]] = {}
    for event in events:
        if isinstance(event, TextDelta):
            deltas.setdefault(event.response_id, []).append(event.delta)
        elif isinstance(event, TextDone):
            assert "".join(deltas.pop(event.response_id, [])) == event.text


async def test_hundreds_of_drops_lose_nothing_and_do_nothing_twice():
    test_tools.reset_gates()
    async with serving() as gateway:
        before = Counter(test_tools.runs)
        baseline = await converse(gateway, random.Random(0), chance=0.0)
        expected = transcript(baseline.events)
        runs_per_conversation = Counter(test_tools.runs) - before
        rng = random.Random(SEED)
        drops = 0
        for _ in range(RUNS):
            test_tools.reset_gates()
            before = Counter(test_tools.runs)
            run = await converse(gateway, random.Random(rng.random()), DROP_CHANCE)
            drops += run.drops
            assert transcript(run.events) == expected
            check_stream(run.events)
            # Every event of the session came once, in order, none missing.
            seqs = [e.seq for e in run.events if e.seq]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            # Every server tool ran exactly once per call, as without drops.
            assert Counter(test_tools.runs) - before == runs_per_conversation
            # Every client function ran once per call and its result was applied once.
            calls = [c.call_id for e in run.events if isinstance(e, ToolCalls) for c in e.calls]
            assert run.runs == baseline.runs
            assert sum(run.runs.values()) == len(calls) == len(set(calls))
            applied = Counter(
                e.call_id
                for e in run.events
                if isinstance(e, ToolStatus) and e.status in TERMINAL and not e.duplicate
            )
            assert all(applied[call_id] == 1 for call_id in calls)
    assert drops >= 200, drops

"""Disconnect torture: hundreds of drops at random points, and nothing lost or done twice.

The same conversation runs once without drops and then again and again with
the socket cut at random points (during deltas, with client calls open, with
async tools pending, during replay itself), with a fixed seed. After every
resume the client's rebuilt transcript must equal the uninterrupted one, every
server tool must have run once per call, and every client result must have
been applied once.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from gateway.protocol import (
    Outbound,
    ResponseCreated,
    ResponseDone,
    SessionResumed,
    TextDelta,
    TextDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.data import tools as test_tools
from tests.support import ResumingClient, serving

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
    client: ResumingClient
    rng: random.Random
    chance: float
    executed: Counter[str] = field(default_factory=Counter)
    """How often the client ran each call's function (once: results are re-sent, not re-run)."""
    answered: set[str] = field(default_factory=set)

    async def next(self) -> Outbound:
        if self.chance and self.rng.random() < self.chance:
            await self.client.drop()
            resumed = await self.client.resume()
            await self._answer_open(resumed)
        event = await self.client.next()
        if isinstance(event, ToolCalls):
            await self._answer(event)
        return event

    async def _answer_open(self, resumed: SessionResumed) -> None:
        fresh = [c for c in resumed.open_calls if c.call_id not in self.answered]
        if fresh:
            await self._run_calls(fresh)

    async def _answer(self, batch: ToolCalls) -> None:
        await self._run_calls([c for c in batch.calls if c.call_id not in self.answered])

    async def _run_calls(self, calls: list) -> None:  # type: ignore[type-arg]
        results = []
        for call in calls:
            self.executed[call.call_id] += 1
            self.answered.add(call.call_id)
            value = {"device_a": "a", "device_b": "b"}[call.tool]
            results.append(
                ToolResult(call_id=call.call_id, tool=call.tool, output={"value": value})
            )
        if results:
            await self.client.send(ToolResults(results=results))

    async def until_done(self, response_id: str) -> None:
        while True:
            event = await self.next()
            if isinstance(event, ResponseDone) and event.response_id == response_id:
                return


async def converse(url: str, rng: random.Random, chance: float) -> Run:
    client = ResumingClient(url)
    await client.start()
    run = Run(client, rng, chance)
    for index, (action, text) in enumerate(SCRIPT):
        if action == "say":
            msg_id = f"m{index}"
            await client.send(UserMessage(text=text, id=msg_id))
            # No drop until the gateway has the message: a lost user message is the
            # app's to resend, not what this test is about.
            while True:
                event = await client.next()
                if isinstance(event, ResponseCreated) and event.in_reply_to == msg_id:
                    break
        else:
            test_tools.gate(f"order:{text}").set()
            while True:
                event = await run.next()
                if isinstance(event, ResponseCreated) and event.call_id is not None:
                    break
        await run.until_done(event.response_id)
    await client.close()
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
        baseline = await converse(gateway.url, random.Random(0), chance=0.0)
        expected = transcript(baseline.client.events)
        runs_per_conversation = Counter(test_tools.runs) - before
        rng = random.Random(SEED)
        drops = 0
        for _ in range(RUNS):
            test_tools.reset_gates()
            before = Counter(test_tools.runs)
            run = await converse(gateway.url, random.Random(rng.random()), DROP_CHANCE)
            drops += run.client.drops
            assert transcript(run.client.events) == expected
            check_stream(run.client.events)
            # Every server tool ran exactly once per call, as without drops.
            assert Counter(test_tools.runs) - before == runs_per_conversation
            # Every client function ran once and its result was applied once.
            assert set(run.executed.values()) == {1}
            applied = Counter(
                e.call_id
                for e in run.client.events
                if isinstance(e, ToolStatus) and e.status in TERMINAL and not e.duplicate
            )
            assert all(applied[call_id] == 1 for call_id in run.executed)
    assert drops >= 200, drops

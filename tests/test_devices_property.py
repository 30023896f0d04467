"""Exactly-once with several devices on one session, over random schedules: devices join
(some offering ``get_battery_level``, some not), leave, lose their socket and resume, while
the first device asks for the battery level again and again. Real sockets, the shipped
Python SDK on every device, the demo agent; each seed is one schedule (replay a failure with
its seed).

Whatever the schedule: every call is settled once (one ``completed`` status, not a
duplicate, in the session's log); the answer names the level of a device that ran the call;
no device runs a call twice; a device that offers no battery never gets its calls; every
device sees each event once, in order.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from client_sdk import Conversation, connect
from gateway.agent.file import DEMO_AGENT
from gateway.wire.v1 import ServerMsg, ToolCalls, ToolStatus
from tests.support import Gateway, serving

pytestmark = pytest.mark.slow  # a gateway and up to five SDK conversations per seed

SEEDS = range(40)
STEPS = 16
WAIT = 15.0
BATTERY = "get_battery_level"


@dataclass
class Device:
    index: int
    conv: Conversation
    offers_battery: bool
    ran: list[str] = field(default_factory=list)
    """The call ids its battery function ran for."""
    events: list[ServerMsg] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    left: bool = False

    @property
    def level(self) -> int:
        return 10 + self.index


async def add_device(
    gateway: Gateway, rng: random.Random, devices: list[Device], *, offers_battery: bool
) -> Device:
    """A new device: the first starts the session, the others join it."""
    index = len(devices)
    if devices:
        session = devices[0].conv.session
        assert session is not None
        conv = connect(gateway.url, join=(session.session_id, session.resume_token))
    else:
        conv = connect(gateway.url)
    device = Device(index, conv, offers_battery)
    if offers_battery:
        turns = rng.randint(0, 4)  # how long it takes: who answers first varies

        @conv.client_function(BATTERY)
        async def battery() -> dict[str, Any]:
            for _ in range(turns):
                await asyncio.sleep(0)
            assert conv.last_seq  # the SDK is mid-conversation
            device.ran.append(_running_call(conv))
            return {"level": device.level / 100}

    stream = conv.events()

    async def record() -> None:
        async for event in stream:
            device.events.append(event)

    await conv.__aenter__()
    device.reader = asyncio.create_task(record())
    await conv.start()
    devices.append(device)
    return device


def _running_call(conv: Conversation) -> str:
    """The id of the call the SDK runs the function for (the task's name says it)."""
    name = asyncio.current_task().get_name()  # type: ignore[union-attr]
    assert name.startswith("client_sdk:call:"), name
    return name.removeprefix("client_sdk:call:")


async def run_schedule(gateway: Gateway, seed: int) -> tuple[list[Device], list[str]]:
    rng = random.Random(seed)
    devices: list[Device] = []
    first = await add_device(gateway, rng, devices, offers_battery=True)
    answers: list[str] = []
    asking: asyncio.Task[None] | None = None

    async def ask() -> None:
        async with asyncio.timeout(WAIT):
            answers.append("".join([d async for d in first.conv.say("what's my battery level?")]))

    for _ in range(STEPS):
        attached = [d for d in devices if not d.left]
        joined = [d for d in attached if d.index]
        match rng.choice(["join", "join", "leave", "drop", "drop", "ask", "ask"]):
            case "join" if len(devices) < 5:
                await add_device(gateway, rng, devices, offers_battery=rng.random() < 0.6)
            case "leave" if joined:
                leaving = rng.choice(joined)
                leaving.left = True
                await leaving.conv.close()
            case "drop":
                dropped = rng.choice(attached).conv._ws
                if dropped is not None:
                    dropped.transport.abort()  # lost signal: the SDK resumes as the device
            case "ask":
                if asking is not None:
                    await asking
                asking = asyncio.create_task(ask())
            case _:
                pass
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)  # let the schedule interleave with the conversation
    if asking is not None:
        await asking
    return devices, answers


@pytest.mark.parametrize("seed", SEEDS)
async def test_every_call_is_answered_once_whatever_the_devices_do(seed: int) -> None:
    async with serving(agent=str(DEMO_AGENT), scripted_pace=0.0) as gateway:
        devices, answers = await run_schedule(gateway, seed)
        try:
            check(devices, answers)
        finally:
            for device in devices:
                if not device.left:
                    await device.conv.close()
                if device.reader is not None:
                    device.reader.cancel()


def check(devices: list[Device], answers: list[str]) -> None:
    first = devices[0]
    log = first.events  # the first device never leaves: it saw every event, once
    settled: dict[str, int] = {}
    for event in log:
        if isinstance(event, ToolStatus) and event.status == "completed" and not event.duplicate:
            settled[event.call_id] = settled.get(event.call_id, 0) + 1
    calls = [
        call.call_id for e in log if isinstance(e, ToolCalls) for call in e.calls
    ]  # the first device offers the battery: every call reached it
    assert len(calls) == len(set(calls)) == len(answers)
    assert settled == dict.fromkeys(calls, 1), "a call settled twice, or never"
    ran_by = {device.level: set(device.ran) for device in devices}
    for call_id, answer in zip(calls, answers, strict=True):
        level = int(answer.removeprefix("Your battery is at ").split("%")[0])
        assert call_id in ran_by[level], f"{answer!r}: device {level - 10} never ran {call_id}"
    for device in devices:
        assert len(device.ran) == len(set(device.ran)), f"device {device.index} ran a call twice"
        numbers = [e.seq for e in device.events if e.seq]
        assert numbers == sorted(set(numbers)), f"device {device.index} saw an event twice"
        got = [c.call_id for e in device.events if isinstance(e, ToolCalls) for c in e.calls]
        if not device.offers_battery:
            assert not got, f"device {device.index} got a call not its own"
            assert not device.ran

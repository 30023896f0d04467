"""One session, several devices (``session.attach``), over real sockets: the shipped Python
SDK for the conversations (``connect(join=...)``), the raw protocol where a test needs to
hold each frame (refusals, a device's resume, per-device ``tool.calls``).

The demo agent: "what's my battery level?" makes the model call ``get_battery_level``, a
client function; the device that registers it answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import websockets

from client_sdk import Conversation, connect, connect_raw
from client_sdk.connection import Connection
from client_sdk.framing import Protocol
from gateway.agent.file import DEMO_AGENT
from gateway.errors import CloseCode
from gateway.wire.v1 import (
    FIRST_DEVICE,
    Error,
    Outbound,
    ResponseDone,
    ServerMsg,
    SessionAttach,
    SessionAttached,
    SessionCreated,
    SessionResume,
    SessionResumed,
    SessionSnapshot,
    SessionStart,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolSpec,
    ToolStatus,
    UserMessage,
)
from tests.support import Gateway, record, serving

WAIT = 10.0
BATTERY = ToolSpec(name="get_battery_level", description="The device's battery level.")


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with serving(agent=str(DEMO_AGENT), scripted_pace=0.0) as running:
        yield running


async def say(conv: Conversation, text: str) -> str:
    async with asyncio.timeout(WAIT):
        return "".join([delta async for delta in conv.say(text)])


def seqs(events: Sequence[ServerMsg]) -> list[int]:
    return [e.seq for e in events if e.seq]


# ----------------------------------------------------------------- the Python SDK


async def test_a_call_runs_on_the_device_that_offers_it_and_both_see_the_answer(
    gateway: Gateway,
) -> None:
    runs: list[str] = []
    async with connect(gateway.url) as laptop:
        created = await laptop.start()
        assert laptop.device_id == FIRST_DEVICE
        async with connect(gateway.url, join=(created.session_id, created.resume_token)) as phone:

            @phone.client_function("get_battery_level")
            async def battery() -> dict[str, Any]:
                runs.append("phone")
                return {"level": 0.82, "charging": True}

            await phone.start()
            assert phone.device_id not in (None, FIRST_DEVICE)
            phone_events = record(phone)
            laptop_events = record(laptop)
            answer = await say(laptop, "what's my battery level?")
            assert answer == "Your battery is at 82% and charging."
            assert runs == ["phone"]
            for recording in (phone_events, laptop_events):
                await recording.until(
                    lambda events: any(isinstance(e, ResponseDone) for e in events)
                )
            # The same events, with the same seq, on both devices; the call only on the phone's.
            assert seqs(phone_events.events) == seqs(laptop_events.events)
            laptop_calls = [e for e in laptop_events.events if isinstance(e, ToolCalls)]
            phone_calls = [e for e in phone_events.events if isinstance(e, ToolCalls)]
            assert [c.seq for c in laptop_calls] == [c.seq for c in phone_calls]
            assert [c.calls for c in laptop_calls] == [[]]
            assert [call.tool for c in phone_calls for call in c.calls] == ["get_battery_level"]
            phone_text = "".join(e.delta for e in phone_events.events if isinstance(e, TextDelta))
            assert phone_text == answer
            phone_events.stop()
            laptop_events.stop()


@pytest.mark.parametrize("protocol", ["json", "msgpack"])
async def test_the_first_answer_wins_and_the_other_device_stops_its_run(
    gateway: Gateway, protocol: Protocol
) -> None:
    slow_run_cancelled = asyncio.Event()
    async with connect(gateway.url, protocol=protocol) as laptop:

        @laptop.client_function("get_battery_level")
        async def slow_battery() -> dict[str, Any]:
            try:
                await asyncio.Event().wait()  # never answers: the phone does first
            except asyncio.CancelledError:
                slow_run_cancelled.set()
                raise
            raise AssertionError("unreachable")

        created = await laptop.start()
        async with connect(
            gateway.url, join=(created.session_id, created.resume_token), protocol=protocol
        ) as phone:

            @phone.client_function("get_battery_level")
            async def battery() -> dict[str, Any]:
                return {"level": 0.5, "charging": False}

            await phone.start()
            assert await say(laptop, "what's my battery level?") == ("Your battery is at 50%.")
            async with asyncio.timeout(WAIT):
                await slow_run_cancelled.wait()


async def test_a_device_that_leaves_leaves_the_others_the_session(gateway: Gateway) -> None:
    async with connect(gateway.url) as laptop:
        created = await laptop.start()
        phone = connect(gateway.url, join=(created.session_id, created.resume_token))
        async with phone:
            await phone.start()
        # The phone closed normally (1000): it left; the session goes on with the laptop.
        assert (await say(laptop, "hello there")).startswith("Hello!")
        assert gateway.runtime.drivers[created.session_id].connections


async def test_a_late_device_gets_the_conversation_so_far(gateway: Gateway) -> None:
    async with connect(gateway.url) as laptop:
        created = await laptop.start()
        first = await say(laptop, "hello there")
        phone = connect(gateway.url, join=(created.session_id, created.resume_token))
        seen = record(phone)
        async with phone:
            await phone.start()
            await seen.until(lambda events: any(isinstance(e, ResponseDone) for e in events))
            # Replayed from seq 1: session.created, the first turn, its text.
            assert seqs(seen.events)[:3] == [1, 2, 3]
            assert "".join(e.delta for e in seen.events if isinstance(e, TextDelta)) == first
            seen.stop()


# ----------------------------------------------------------------- the raw protocol


async def start(conn: Connection, **fields: Any) -> SessionCreated:
    await conn.send(SessionStart(**fields))
    created = await conn.recv()
    assert isinstance(created, SessionCreated), created
    return created


async def attach(conn: Connection, created: SessionCreated, **fields: Any) -> SessionAttached:
    await conn.send(
        SessionAttach(session_id=created.session_id, resume_token=created.resume_token, **fields)
    )
    attached = await conn.recv()
    assert isinstance(attached, SessionAttached), attached
    return attached


async def events_until(conn: Connection, kind: type) -> list[Outbound]:
    return await conn.recv_until(lambda e: isinstance(e, kind), within=WAIT)


async def test_attach_answers_with_the_device_and_the_count_then_replays(
    gateway: Gateway,
) -> None:
    async with connect_raw(gateway.url) as phone, connect_raw(gateway.url) as laptop:
        created = await start(phone, client_functions=[BATTERY])
        attached = await attach(laptop, created, last_seq=0)
        assert attached.devices == 2
        assert attached.device_id.startswith("dev_")
        assert attached.device_id != FIRST_DEVICE
        assert (attached.replayed_from, attached.last_seq) == (1, 1)
        replayed = await laptop.recv()
        assert isinstance(replayed, SessionCreated)
        assert replayed.seq == 1

        await phone.send(UserMessage(text="what's my battery level?"))
        phone_calls = (await events_until(phone, ToolCalls))[-1]
        laptop_calls = (await events_until(laptop, ToolCalls))[-1]
        assert isinstance(phone_calls, ToolCalls)
        assert isinstance(laptop_calls, ToolCalls)
        assert phone_calls.seq == laptop_calls.seq
        assert laptop_calls.calls == []
        (call,) = phone_calls.calls
        # The phone answers; the laptop's late answer for the same call is a duplicate.
        result = ToolResult(call_id=call.call_id, tool=call.tool, output={"level": 0.3})
        await phone.send(ToolResults(results=[result]))
        statuses = [e for e in await events_until(laptop, ToolStatus)]
        assert statuses[-1].status == "completed"  # type: ignore[union-attr]
        await laptop.send(ToolResults(results=[result]))
        duplicate = (await events_until(laptop, ToolStatus))[-1]
        assert isinstance(duplicate, ToolStatus)
        assert duplicate.duplicate
        done = [e for e in await events_until(phone, ResponseDone) if isinstance(e, TextDelta)]
        assert "30%" in "".join(e.delta for e in done)


async def test_a_device_resumes_as_itself_and_the_others_stay(gateway: Gateway) -> None:
    async with connect_raw(gateway.url) as laptop:
        phone = await websockets.connect(gateway.url, subprotocols=["gateway.v1"])  # type: ignore[list-item]
        phone_conn = Connection(phone)
        created = await start(phone_conn, client_functions=[BATTERY])
        attached = await attach(laptop, created)
        await laptop.recv()  # the replayed session.created
        phone.transport.abort()  # the phone loses its signal
        async with connect_raw(gateway.url) as again:
            await again.send(
                SessionResume(
                    session_id=created.session_id,
                    resume_token=created.resume_token,
                    last_seq=1,
                    device_id=FIRST_DEVICE,
                    client_functions=[BATTERY],
                )
            )
            resumed = await again.recv()
            assert isinstance(resumed, SessionResumed)
            assert resumed.device_id == FIRST_DEVICE
            # The laptop is still attached: it gets what the phone's turn says.
            await again.send(UserMessage(text="hello there"))
            await events_until(laptop, ResponseDone)
            await events_until(again, ResponseDone)  # read: a client that reads not closes slowly
            assert attached.device_id in {
                c.device for c in gateway.runtime.drivers[created.session_id].connections
            }


async def test_a_resume_naming_no_device_takes_the_session_over_from_every_device(
    gateway: Gateway,
) -> None:
    async with connect_raw(gateway.url) as phone, connect_raw(gateway.url) as laptop:
        created = await start(phone)
        await attach(laptop, created)
        async with connect_raw(gateway.url) as old_client:
            await old_client.send(
                SessionResume(
                    session_id=created.session_id, resume_token=created.resume_token, last_seq=1
                )
            )
            assert isinstance(await old_client.recv(), SessionResumed)
            for taken in (phone, laptop):
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await taken.recv_until(lambda _: False, within=WAIT)
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == CloseCode.TAKEN_OVER


@pytest.mark.parametrize(
    ("session_id", "token", "code"),
    [
        ("sess_unknown", "whatever", CloseCode.UNKNOWN_SESSION),
        (None, "wrong-token", CloseCode.UNAUTHORIZED),
    ],
)
async def test_attach_is_refused_as_a_resume_is(
    gateway: Gateway, session_id: str | None, token: str, code: int
) -> None:
    async with connect_raw(gateway.url) as phone, connect_raw(gateway.url) as laptop:
        created = await start(phone)
        await laptop.send(
            SessionAttach(session_id=session_id or created.session_id, resume_token=token)
        )
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await laptop.recv(within=WAIT)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == code


async def test_attach_mid_session_is_an_error(gateway: Gateway) -> None:
    async with connect_raw(gateway.url) as phone:
        created = await start(phone)
        await phone.send(
            SessionAttach(session_id=created.session_id, resume_token=created.resume_token, id="a1")
        )
        error = await phone.recv()
        assert isinstance(error, Error)
        assert error.in_reply_to == "a1"
        assert "session.attach must be the first message" in error.message


async def test_a_device_joining_past_the_log_rebuilds_from_the_snapshot_as_itself() -> None:
    # A log of 4 events: the first turn pushes session.created out of it.
    async with (
        serving(agent=str(DEMO_AGENT), scripted_pace=0.0, replay_max_events=4) as gateway,
        connect(gateway.url) as laptop,
    ):
        created = await laptop.start()
        first = await say(laptop, "hello there")
        phone = connect(gateway.url, join=(created.session_id, created.resume_token))
        seen = record(phone)
        async with phone:
            await phone.start()
            await seen.until(lambda s: any(isinstance(e, SessionSnapshot) for e in s))
            assert phone.device_id not in (None, FIRST_DEVICE)
            assert phone.last_seq == laptop.last_seq
            # It is a device of the session like any other: the next turn reaches it.
            second = await say(laptop, "hello there")
            await seen.until(lambda s: any(isinstance(e, ResponseDone) for e in s))
            assert (
                "".join(e.delta for e in seen.events if isinstance(e, TextDelta)) == second == first
            )
            seen.stop()

"""The Python SDK against a real gateway: client functions, streaming, reconnects, chat."""

from __future__ import annotations

import asyncio

import pytest

from client_sdk import ServerError, SessionClosed, connect
from gateway.wire.v1 import SessionResumed, SessionUpdated, TextDelta, TextDone, ToolCalls
from tests.data.tools import reset_gates
from tests.support import serving


@pytest.fixture
async def gateway():
    reset_gates()
    async with serving() as running:
        yield running


async def test_quick_start():
    async with serving(agent=None, scripted_pace=0.0) as demo:
        # The README's quick start, as is (with the test gateway's URL).
        async with connect(demo.url) as conv:

            @conv.client_function("get_battery_level")
            async def battery() -> dict[str, object]:
                return {"level": 0.82, "charging": False}

            text = "".join([delta async for delta in conv.say("what's my battery level?")])
    assert text == "Your battery is at 82%."


async def test_say_joins_model_steps_with_a_space_as_the_web_demo_does():
    async with serving(agent=None, scripted_pace=0.0) as demo, connect(demo.url) as conv:

        @conv.client_function("open_settings")
        def open_settings(section: str | None = None) -> dict[str, bool]:
            return {"opened": True}

        events = conv.events()
        text = "".join([delta async for delta in conv.say("open the settings")])
        steps = []
        async for event in events:
            if isinstance(event, TextDone):
                steps.append(event.text)
            if len(steps) == 2:
                break
    assert steps == ["Sure, opening the settings.", "The settings are open."]
    assert text == "Sure, opening the settings. The settings are open."


async def test_client_functions_run_concurrently_with_typed_arguments(gateway):
    a_started, b_started = asyncio.Event(), asyncio.Event()
    async with connect(gateway.url) as conv:

        @conv.client_function("device_a")
        async def device_a() -> dict[str, str]:
            a_started.set()
            await asyncio.wait_for(b_started.wait(), 5)  # both must run at once
            return {"value": "a"}

        @conv.client_function("device_b")
        def device_b() -> dict[str, str]:  # a sync function runs in a thread
            b_started.set()
            return {"value": "b"}

        text = "".join([d async for d in conv.say("two")])
    assert text == "A=a B=b"


async def test_a_handler_that_raises_becomes_an_error_result(gateway):
    async with connect(gateway.url) as conv:

        @conv.client_function("device_a")
        async def device_a() -> dict[str, str]:
            raise ValueError("no device here")

        text = "".join([d async for d in conv.say("one")])
    assert text == "calling A A failed: ValueError: no device here"


async def test_a_handler_that_overruns_its_deadline_is_cancelled(gateway):
    cancelled = asyncio.Event()
    async with connect(gateway.url) as conv:

        @conv.client_function("slow_device")
        async def slow_device() -> dict[str, str]:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return {}

        text = "".join([d async for d in conv.say("slow")])
    assert cancelled.is_set()
    assert text.startswith("slow failed:")


async def test_typed_arguments_and_a_function_added_after_the_start(gateway):
    async with connect(gateway.url) as conv:
        await conv.start()
        updates = conv.events()

        @conv.client_function("strict_device")
        def strict(n: int) -> dict[str, int]:
            return {"twice": n * 2}

        update = await anext(updates)
        await updates.aclose()
        assert isinstance(update, SessionUpdated)
        declared = {t.name for t in update.tools}
        text = "".join([d async for d in conv.say("badargs")])
    assert "strict_device" in declared
    assert text.startswith("strict failed: invalid arguments")  # "abc" is not an int


async def test_errors_and_closes_are_typed_exceptions(gateway):
    async with connect(gateway.url) as conv:
        with pytest.raises(ServerError) as refused:
            async for _ in conv.say("x" * 40_000):
                pass
        assert refused.value.code == "message_too_large"
        session_id = (await conv.start()).session_id
        server_side = gateway.runtime.drivers[session_id].connection
        assert server_side is not None
        server_side.close(4009, "taken over")  # a close that must not be resumed
        with pytest.raises(SessionClosed) as closed:
            async for _ in conv.say("echo hello"):
                pass
    assert closed.value.closed_with == 4009


async def cut_after_deltas(gateway, conv, count: int) -> None:
    """Cut the gateway's side of the socket once ``count`` deltas went out."""
    seen = 0
    async for event in conv.events():
        if isinstance(event, TextDelta):
            seen += 1
            if seen == count:
                session_id = conv.session.session_id
                connection = gateway.runtime.drivers[session_id].connection
                connection.close(1013, "cut by the test")
                return


async def test_reconnect_during_a_stream_loses_and_repeats_nothing(gateway):
    expected = (
        "this answer streams slowly word by word so that a test can cancel it in the middle "
        "of the stream and check that nothing else arrives afterwards even though many more "
        "words were still to come in this long and rather boring sentence that goes on and on"
    )
    async with connect(gateway.url) as conv:
        await conv.start()
        cutter = asyncio.create_task(cut_after_deltas(gateway, conv, 5))
        text = "".join([d async for d in conv.say("slowtext")])
        await cutter
        assert conv.reconnects == 1
    assert text == expected


async def test_reconnect_with_a_call_open_applies_the_result_once(gateway):
    release = asyncio.Event()
    runs = 0
    async with connect(gateway.url) as conv:

        @conv.client_function("device_a")
        async def device_a() -> dict[str, str]:
            nonlocal runs
            runs += 1
            await release.wait()
            return {"value": "after the cut"}

        session = await conv.start()

        async def cut_then_release() -> None:
            async for event in conv.events():
                if isinstance(event, ToolCalls):
                    gateway.runtime.drivers[session.session_id].connection.close(1013, "cut")
                elif isinstance(event, SessionResumed):
                    release.set()  # the result goes out on the new socket
                    return

        helper = asyncio.create_task(cut_then_release())
        text = "".join([d async for d in conv.say("one")])
        await helper
    assert text == "calling A A=after the cut"
    assert runs == 1

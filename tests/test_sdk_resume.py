"""The Python SDK's resume and housekeeping against a real gateway, through a proxy that
cuts sockets and misbehaves: no socket or task is left behind, nothing is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from client_sdk import SessionClosed, connect
from gateway.errors import CloseCode
from gateway.wire.v1 import (
    Error,
    Outbound,
    ResponseRetrying,
    SessionResumed,
    SessionUpdated,
    ToolResult,
)
from tests.data.tools import reset_gates
from tests.proxy import Proxy, proxy_to
from tests.retrying_model import RetriesWhenFlaky
from tests.support import Gateway, serving


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    reset_gates()
    # The gateway never closes a silent socket by itself here: a socket left open is the SDK's.
    async with serving(first_message_timeout=60) as running:
        yield running


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[Proxy]:
    async with proxy_to(gateway.port) as running:
        yield running


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reached the loop's exception handler ("Task exception was never retrieved",
    "Exception in callback"...): each is a bug."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)


async def next_of(events: AsyncIterator[Outbound], kind: type) -> Any:
    async with asyncio.timeout(10):
        async for event in events:
            if isinstance(event, kind):
                return event
    raise AssertionError(f"events ended before a {kind.__name__}")


async def test_close_while_a_resume_waits_leaves_no_socket_open(proxy):
    async with connect(proxy.url()) as conv:
        await conv.start()
        proxy.mode = "mute"  # the gateway will never hear the session.resume
        proxy.drop()
        await asyncio.wait_for(proxy.swallowed.wait(), 10)
        assert proxy.open == 1  # the resume's socket, waiting for an answer
    await proxy.wait_open(0, within=5)


@pytest.mark.parametrize("mode", ["mute", "garble"])
async def test_a_resume_answered_badly_or_not_at_all_drops_its_socket_and_retries(proxy, mode):
    # "mute": the answer never comes (TimeoutError); "garble": it is not JSON (DecodeError).
    async with connect(proxy.url(), attempt_timeout=0.3) as conv:
        await conv.start()
        resumed = conv.events()
        proxy.mode = mode
        proxy.drop()
        # The first connection was cut; the second, the failed resume's, the SDK ends itself
        # (the gateway would keep it open for a minute).
        await proxy.wait_until(lambda: proxy.closed >= 2)
        proxy.mode = "pass"
        assert isinstance(await next_of(resumed, SessionResumed), SessionResumed)
        text = "".join([d async for d in conv.say("echo still here")])
        assert proxy.open == 1
    assert text == "still here"


async def test_a_sdk_task_cancelled_reports_nothing_and_close_leaves_none(gateway, loop_errors):
    before = asyncio.all_tasks()
    async with connect(gateway.url) as conv:
        await conv.start()

        @conv.client_function("late_device")
        def late() -> dict[str, str]:
            return {}

        # The session.update's task, not yet run: cancel it as the loop's shutdown would.
        spawned = {t for t in asyncio.all_tasks() - before if "_send" in repr(t.get_coro())}
        assert spawned
        for task in spawned:
            task.cancel()
        await asyncio.wait(spawned)
    left = {t for t in asyncio.all_tasks() - before if "Conversation" in repr(t.get_coro())}
    assert left == set()
    assert loop_errors == []


async def test_a_session_update_lost_in_a_drop_is_sent_again(proxy):
    async with connect(proxy.url(), attempt_timeout=0.3) as conv:
        await conv.start()
        events = conv.events()
        proxy.mode = "mute"
        proxy.drop()
        await asyncio.wait_for(proxy.swallowed.wait(), 10)  # the SDK is resuming

        @conv.client_function("strict_device")  # its session.update goes nowhere
        def strict(n: int) -> dict[str, int]:
            return {"twice": n * 2}

        proxy.mode = "pass"
        await next_of(events, SessionResumed)
        updated = await next_of(events, SessionUpdated)
        text = "".join([d async for d in conv.say("badargs")])
    assert "strict_device" in {t.name for t in updated.tools}
    assert text.startswith("strict failed: invalid arguments")


async def test_unconfirmed_results_are_resent_in_batches_the_gateway_accepts(proxy):
    async with connect(proxy.url()) as conv:
        await conv.start()
        events = conv.events()
        # 200 results the gateway never confirmed (here: of calls it does not know).
        for i in range(200):
            call_id = f"call_unknown_{i}"
            conv._outbox.results[call_id] = ToolResult(call_id=call_id, tool="device_a", output={})
        proxy.drop()
        await next_of(events, SessionResumed)
        errors: list[Error] = []
        while len(errors) < 200:
            errors.append(await next_of(events, Error))
    # One message of 200 would be refused whole (invalid_message); each batch is applied.
    assert {e.code for e in errors} == {"unknown_call"}
    assert {e.call_id for e in errors} == {f"call_unknown_{i}" for i in range(200)}


async def test_response_retrying_reaches_events_and_say_still_streams(gateway):
    gateway.model.inner = RetriesWhenFlaky(gateway.model.inner, always=True)  # type: ignore[assignment]
    async with connect(gateway.url) as conv:
        await conv.start()
        events = conv.events()
        text = "".join([d async for d in conv.say("echo after a retry")])
        retrying = await next_of(events, ResponseRetrying)
    assert text == "after a retry"
    assert (retrying.attempt, retrying.delay, retrying.reason) == (1, 0.25, "HTTP 503")


async def test_close_ends_pending_iterators_with_session_closed(gateway):
    async with connect(gateway.url) as conv:
        await conv.start()
        events = conv.events()
        waiting = asyncio.create_task(anext(events))
        await asyncio.sleep(0)  # the iterator is subscribed and waiting
    with pytest.raises(SessionClosed) as closed:
        await asyncio.wait_for(waiting, 5)
    assert closed.value.closed_with == 1000


async def test_a_text_frame_that_is_not_utf8_closes_1007_and_the_sdk_resumes(gateway):
    async with connect(gateway.url) as conv:
        created = await conv.start()
        events = conv.events()
        first = conv._ws
        assert first is not None
        # What a broken encoder would send: the gateway's server library closes with 1007.
        await first.send(b'{"type": "ping", "id": "\xff"}', text=True)
        await next_of(events, SessionResumed)
        text = "".join([d async for d in conv.say("echo still here")])
        assert conv.session is not None
        assert conv.session.session_id == created.session_id
    assert first.close_code == CloseCode.INVALID_DATA
    assert conv.reconnects == 1
    assert text == "still here"


async def test_a_session_resume_the_gateway_refuses_as_invalid_ends_with_1008(proxy):
    async with connect(proxy.url()) as conv:
        await conv.start()
        events = conv.events()
        conv.last_seq = -1  # a bug's cursor: the session.resume does not validate
        proxy.drop()
        with pytest.raises(SessionClosed) as closed:
            await next_of(events, SessionResumed)
    # Not retried: the same message would be refused again.
    assert closed.value.closed_with == CloseCode.POLICY
    assert "last_seq" in closed.value.reason
    assert proxy.accepted == 2

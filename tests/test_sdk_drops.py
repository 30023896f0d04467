"""The Python SDK survives every kind of drop, as an app on a phone on a train would see them:
before the session exists, during a resume, during a registration, at close(). The shipped SDK
talks to the real gateway through a proxy that cuts exactly where each case is; then a seeded
run cuts at random points, and its transcripts must equal those of a run without drops."""

from __future__ import annotations

import asyncio
import random
import socket
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets

from client_sdk import Conversation, SessionClosed, connect
from gateway.wire.v1 import SessionUpdated
from tests.proxy import Proxy, proxy_to
from tests.support import Gateway, serving

TTL = 60.0
"""Long: a session these tests see end, ended because the SDK ended it, not by expiring."""


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with serving(session_ttl=TTL) as running:
        yield running


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[Proxy]:
    async with proxy_to(gateway.port) as running:
        yield running


def sdk(proxy: Proxy, **options: Any) -> Conversation:
    """The SDK as an app would set it up, through the proxy, quick to retry."""
    options.setdefault("max_reconnect_delay", 0.1)
    return connect(proxy.url(), **options)


async def answer(conv: Conversation, text: str) -> str:
    async with asyncio.timeout(20):
        return "".join([delta async for delta in conv.say(text)])


def attached(gateway: Gateway) -> list[str]:
    """The sessions the gateway holds that have a socket."""
    return [sid for sid, d in gateway.runtime.drivers.items() if d.connection is not None]


# ----------------------------------------------------------------- before session.created


async def test_a_drop_as_session_start_is_sent_starts_the_session_on_a_new_socket(
    gateway: Gateway, proxy: Proxy
):
    cut = proxy.cut_at("up", "session.start")  # the gateway never hears it
    async with sdk(proxy) as conv:
        assert await answer(conv, "echo made it") == "made it"
        assert cut.done.is_set()
        assert conv.session is not None
        assert list(gateway.runtime.drivers) == [conv.session.session_id]
        assert conv.reconnects == 0  # nothing was resumed: the session started once


async def test_a_lost_session_created_starts_another_session(gateway: Gateway, proxy: Proxy):
    cut = proxy.cut_at("down", "session.created")  # the gateway started one; no answer came
    async with sdk(proxy) as conv:
        assert await answer(conv, "echo made it") == "made it"
        assert cut.done.is_set()
        assert conv.session is not None
        # The first session has no socket and never will: it expires after session_ttl.
        assert len(gateway.runtime.drivers) == 2
        assert attached(gateway) == [conv.session.session_id]


async def test_a_session_start_never_answered_is_tried_again_on_a_new_socket(proxy: Proxy):
    proxy.mode = "mute"  # the first socket's frames go nowhere
    conv = sdk(proxy, attempt_timeout=0.3)
    async with conv:
        proxy.mode = "pass"  # the next socket's are forwarded
        assert await answer(conv, "echo made it") == "made it"
    assert proxy.accepted == 2


async def test_the_first_connect_is_retried_when_upgrades_fail_or_hang(proxy: Proxy):
    proxy.upgrades = ["reset", "hold", "reset"]
    async with sdk(proxy, attempt_timeout=0.3) as conv:
        assert await answer(conv, "echo made it") == "made it"
    assert (proxy.accepted, proxy.held) == (4, 1)


async def test_the_first_connect_gives_up_after_give_up_after():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conv = connect(f"ws://127.0.0.1:{port}/v1/realtime", give_up_after=0.3)
    with pytest.raises(SessionClosed) as closed:
        async with conv:
            pass
    assert (closed.value.closed_with, closed.value.reason) == (
        1006,
        "could not reach the gateway for 0.3 s",
    )


async def test_a_first_connect_refused_for_good_is_not_retried(gateway: Gateway):
    wrong_path = gateway.url.replace("/v1/realtime", "/v1/nowhere")
    with pytest.raises(websockets.InvalidStatus) as refused:  # at once, not in a minute
        async with connect(wrong_path, give_up_after=60):
            pass
    # Starlette refuses a WebSocket to a path it has no route for by closing it before the
    # handshake, which uvicorn answers with 403.
    assert refused.value.response.status_code == 403


# ----------------------------------------------------------------- registrations and resumes


def lamp(on: bool) -> dict[str, bool]:
    """Switch the lamp."""
    return {"ok": on}


async def test_a_client_function_registered_as_its_update_is_cut_is_declared_after_the_resume(
    proxy: Proxy,
):
    async with sdk(proxy) as conv:
        await conv.start()
        events = conv.events()
        cut = proxy.cut_at("up", "session.update")
        conv.add_client_function(lamp, name="lamp_x")
        async with asyncio.timeout(10):
            await cut.done.wait()
            async for event in events:
                if isinstance(event, SessionUpdated):
                    break
        assert "lamp_x" in {t.name for t in event.tools}
        assert conv.reconnects == 1


async def test_a_resume_whose_upgrade_is_reset_or_never_answered_is_tried_again(proxy: Proxy):
    async with sdk(proxy, attempt_timeout=0.3) as conv:
        assert await answer(conv, "echo one") == "one"
        proxy.upgrades = ["reset", "hold"]
        proxy.drop()
        assert await answer(conv, "echo two") == "two"
        assert conv.reconnects == 1
    assert proxy.held == 1


async def test_the_sdk_gives_up_resuming_after_give_up_after(proxy: Proxy):
    async with sdk(proxy, give_up_after=0.3) as conv:
        await conv.start()
        proxy.upgrades = ["reset"] * 1000
        proxy.drop()
        with pytest.raises(SessionClosed) as closed:
            await answer(conv, "echo lost")
    assert (closed.value.closed_with, closed.value.reason) == (
        1006,
        "could not reach the gateway for 0.3 s",
    )


# ----------------------------------------------------------------- close() mid-reconnect


@pytest.mark.parametrize("where", ["upgrade_held", "resume_unanswered", "between_attempts"])
async def test_close_during_a_reconnect_ends_the_session_at_once(
    gateway: Gateway, proxy: Proxy, where: str
):
    conv = sdk(proxy, max_reconnect_delay=5.0)
    async with conv:
        await conv.start()
        if where == "upgrade_held":
            proxy.upgrades = ["hold"]
        elif where == "resume_unanswered":
            proxy.mode = "mute"
        else:
            proxy.upgrades = ["reset"] * 5
        proxy.drop()
        if where == "upgrade_held":
            await proxy.wait_until(lambda: proxy.held == 1)
        elif where == "resume_unanswered":
            await asyncio.wait_for(proxy.swallowed.wait(), 10)
            proxy.mode = "pass"  # for the socket close() opens to end the session
        else:
            await proxy.wait_until(lambda: proxy.accepted == 6)  # the wait before the next
            proxy.upgrades = []
        assert not gateway.runtime.idle.is_set()
    # Leaving the block ended the session on the gateway, not its TTL a minute from now.
    await asyncio.wait_for(gateway.runtime.idle.wait(), 5)
    await proxy.wait_open(0, within=5)


# ----------------------------------------------------------------- drops at random points


async def conversation(proxy: Proxy, index: int) -> tuple[list[str], Counter[str]]:
    """One app's conversation: its answers, and how many times each device function ran."""
    runs: Counter[str] = Counter()

    def device_a() -> dict[str, str]:
        runs["device_a"] += 1
        return {"value": "a"}

    def device_b() -> dict[str, str]:
        runs["device_b"] += 1
        return {"value": "b"}

    conv = sdk(proxy, attempt_timeout=2.0, max_reconnect_delay=0.05)
    conv.add_client_function(device_a, name="device_a")
    conv.add_client_function(device_b, name="device_b")
    async with conv:
        script = [f"echo hello {index}", "one", "two", "add 2 3", f"echo bye {index}"]
        answers = [await answer(conv, text) for text in script]
    return answers, runs


async def run_all(proxy: Proxy, count: int) -> list[tuple[list[str], Counter[str]]]:
    """``count`` conversations, six at a time."""
    results = []
    for start in range(0, count, 6):
        batch = range(start, min(start + 6, count))
        results += await asyncio.gather(*(conversation(proxy, i) for i in batch))
    return results


async def test_conversations_cut_at_random_points_come_through_as_without_drops(proxy: Proxy):
    calm = await run_all(proxy, 24)
    assert calm[0] == (
        ["hello 0", "calling A A=a", "A=a B=b", "sum=5", "bye 0"],
        Counter(device_a=2, device_b=1),
    )
    rng = random.Random(17)
    proxy.budget = lambda: rng.randint(2, 40)
    dropped_before = proxy.closed
    rough = await run_all(proxy, 24)
    assert rough == calm  # same answers; every client function ran once per call
    assert proxy.closed - dropped_before > 48  # it was rough: many sockets per conversation

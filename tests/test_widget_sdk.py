"""Widget tools from the Python SDK: ``on_widget`` shows the call's widget and returns the
user's answer as the result, against the demo agent's ``choose_pickup_store`` (a choice)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from client_sdk import connect
from gateway.wire.v1 import ClientCall, ToolStatus
from tests.support import Gateway, serving

ASK = "which store should I pick up from?"


@pytest.fixture
async def demo() -> AsyncIterator[Gateway]:
    async with serving(agent=None, scripted_pace=0.0) as gateway:
        yield gateway


async def test_the_users_choice_is_the_result(demo: Gateway):
    shown: list[ClientCall] = []
    async with connect(demo.url) as conv:

        @conv.on_widget
        async def pick(call: ClientCall) -> dict[str, str]:
            shown.append(call)
            return {"choice": "Harbor Mall"}

        answer = "".join([d async for d in conv.say(ASK)])
    assert answer == "Great: your order will wait for you at Harbor Mall."
    (call,) = shown
    assert call.widget is not None
    assert (call.widget.type, call.widget.prompt) == (
        "choice",
        "Which store should I pick up from?",
    )
    assert call.widget.options == ["Downtown", "Harbor Mall", "Airport"]


async def test_an_answer_off_the_options_or_a_failing_handler_is_an_error_result(demo: Gateway):
    async with connect(demo.url) as conv:
        conv.on_widget(lambda call: {"choice": "the moon"})  # a plain function: a thread
        off = "".join([d async for d in conv.say(ASK)])

        def broken(call: ClientCall) -> dict[str, str]:
            raise RuntimeError("the screen is off")

        conv.on_widget(broken)
        failed = "".join([d async for d in conv.say(ASK)])
    assert off.startswith("No store picked: ")
    assert failed == "No store picked: RuntimeError: the screen is off."


async def test_a_call_that_ends_unanswered_stops_the_handler(demo: Gateway):
    asking = asyncio.Event()
    stopped = asyncio.Event()
    async with connect(demo.url) as conv:
        events = conv.events()

        @conv.on_widget
        async def wait_for_the_user(call: ClientCall) -> dict[str, str]:
            asking.set()
            try:
                await asyncio.Event().wait()  # the user never answers
            finally:
                stopped.set()
            return {}

        await conv.post(ASK)
        async with asyncio.timeout(10):
            await asking.wait()
            await conv.cancel()  # the response and its open call end
            await stopped.wait()
            async for event in events:
                if isinstance(event, ToolStatus) and event.status == "cancelled":
                    break
        assert event.tool == "choose_pickup_store"

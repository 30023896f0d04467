"""Widget tools: client functions whose result comes from the user. Checked at startup and
in session.start, filled in from the call's arguments, the user's answer checked against
the output schema made for the widget; over a real socket with the demo agent."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from client_sdk import connect
from gateway.core.tool import ToolDef, check_tool
from gateway.errors import ConfigError
from gateway.wire.v1 import (
    ResponseDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
    Widget,
)
from tests.browser import last_answer, open_page, send
from tests.support import serving, session

STORES = ["Downtown", "Harbor Mall", "Airport"]


def widget_tool(widget: Widget, **schema: object) -> ToolDef:
    return ToolDef(
        name="ask",
        description="Ask the user.",
        kind="client",
        input_schema={"type": "object", **schema},
        widget=widget,
    )


@pytest.mark.parametrize(
    ("widget", "words"),
    [
        (Widget(type="choice", prompt="Pick"), "either options or options_arg"),
        (Widget(type="choice", prompt="Pick", options_arg="nope"), "not an array argument"),
        (Widget(type="form", prompt="Fill"), "has fields"),
    ],
)
def test_a_widget_that_cannot_work_is_a_startup_error(widget: Widget, words: str):
    with pytest.raises(ConfigError, match=words):
        check_tool(widget_tool(widget))


def test_a_widgets_answer_is_checked_like_any_result():
    entry = check_tool(widget_tool(Widget(type="choice", prompt="Pick", options=["a", "b"])))
    assert entry.output_validator is not None
    assert entry.output_validator.problem({"choice": "a"}) is None
    assert entry.output_validator.problem({"choice": "c"}) is not None


async def test_the_call_carries_the_widget_filled_in_and_the_answer_is_the_result():
    async with serving(agent=None, scripted_pace=0.0) as demo, session(demo.url) as (conn, _):
        await conn.send(UserMessage(text="which store should I pick up from?"))
        events = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
        calls = events[-1]
        assert isinstance(calls, ToolCalls)
        (call,) = calls.calls
        assert call.widget == Widget(
            type="choice", prompt="Which store should I pick up from?", options=STORES
        )
        off = ToolResult(call_id=call.call_id, tool=call.tool, output={"choice": "Moon"})
        await conn.send(ToolResults(results=[off]))  # not one of the options
        refused = await conn.recv_until(lambda e: isinstance(e, ToolStatus))
        status = refused[-1]
        assert isinstance(status, ToolStatus)
        assert (status.status, status.error) == (
            "failed",
            "the choice is not one of the options shown",
        )
        await conn.recv_until(lambda e: isinstance(e, ResponseDone))

        await conn.send(UserMessage(text="which store should I pick up from?"))
        events = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
        (call,) = events[-1].calls  # type: ignore[union-attr]
        answer = ToolResult(call_id=call.call_id, tool=call.tool, output={"choice": "Airport"})
        await conn.send(ToolResults(results=[answer]))
        done = await conn.recv_until(
            lambda e: (
                getattr(e, "type", "") == "response.done" or e.__class__.__name__ == "ResponseDone"
            )
        )
    text = "".join(getattr(e, "delta", "") for e in done)
    assert text == "Great: your order will wait for you at Airport."


async def test_the_python_sdk_answers_a_widget_call_with_a_client_function():
    async with serving(agent=None, scripted_pace=0.0) as demo, connect(demo.url) as conv:

        @conv.client_function("choose_pickup_store")
        async def choose(stores: list[str]) -> dict[str, str]:
            return {"choice": stores[1]}

        answer = "".join([d async for d in conv.say("which store should I pick up from?")])
    assert answer == "Great: your order will wait for you at Harbor Mall."


@pytest.mark.slow  # a real Chromium, as the web demo's tests
async def test_the_web_demo_shows_the_widget_and_the_click_is_the_answer():
    async with (
        serving(agent=None, scripted_pace=0.0) as demo,
        open_page(demo, "test_the_web_demo_shows_the_widget_and_the_click_is_the_answer") as page,
    ):
        await send(page, "which store should I pick up from?")
        card = page.locator("div.widget[data-type=choice]")
        await expect(card).to_have_attribute("data-status", "asking")
        await expect(card.locator("button.widget-option")).to_have_text(STORES)
        await card.locator("button.widget-option", has_text="Harbor Mall").click()
        await expect(card).to_have_attribute("data-status", "completed")
        await expect(last_answer(page)).to_contain_text(
            "Great: your order will wait for you at Harbor Mall."
        )

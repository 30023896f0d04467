"""Confirmation over real sockets against the demo agent, whose "cancel my order 1234" calls
``cancel_order`` (marked confirm): a confirmation asked again after a dropped socket and
left to expire; approved and declined from both shipped SDKs; approved in the web demo."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from playwright.async_api import expect

from client_sdk import Decline, connect
from gateway.wire.v1 import (
    ConfirmItem,
    ResponseDone,
    SessionResumed,
    TextDelta,
    ToolConfirm,
    ToolStatus,
    UserMessage,
)
from tests.browser import last_answer, open_page, send
from tests.support import resuming, serving, session
from tests.test_resume import cut, until
from tests.test_tool_choice_e2e import run_js

CANCEL = "cancel my order 1234"


async def test_a_confirmation_survives_a_drop_and_expires_unanswered_without_running():
    async with serving(agent=None, scripted_pace=0.0, client_call_timeout=1.0) as demo:
        async with session(demo.url) as (conn, created):
            await conn.send(UserMessage(text=CANCEL))
            before = await until(conn, ToolConfirm)
            asked = before[-1]
            assert isinstance(asked, ToolConfirm)
            (item,) = asked.calls
            assert (item.tool, item.prompt, item.kind) == (
                "cancel_order",
                "Cancel order 1234?",
                "server",
            )
            await cut(conn)
        async with resuming(demo.url, created, asked.seq) as (conn, resumed):
            assert isinstance(resumed, SessionResumed)
            assert [c.call_id for c in resumed.open_confirmations] == [item.call_id]
            rest = await until(conn, ResponseDone)  # nobody answers: the deadline passes
    statuses = [(e.status, e.error) for e in rest if isinstance(e, ToolStatus)]
    assert statuses == [("expired", "the user did not confirm in time")]
    text = "".join(e.delta for e in rest if isinstance(e, TextDelta))
    assert text == "I didn't cancel order 1234: the user did not confirm in time."


DONE = "Done: order 1234 is cancelled."


async def test_the_python_sdk_approves_and_declines_what_the_user_decides():
    async with serving(agent=None, scripted_pace=0.0) as demo, connect(demo.url) as conv:
        asked: list[ConfirmItem] = []
        decisions: list[object] = [True, Decline(reason="I still want it")]

        @conv.on_confirm
        async def confirm(item: ConfirmItem) -> object:
            asked.append(item)
            return decisions[len(asked) - 1]

        async def say(text: str) -> str:
            return "".join([d async for d in conv.say(text)])

        assert await say(CANCEL) == DONE
        assert await say(CANCEL) == (
            "I didn't cancel order 1234: declined by the user: I still want it."
        )
        assert [i.prompt for i in asked] == ["Cancel order 1234?"] * 2


async def test_without_a_handler_the_sdk_declines_rather_than_guess():
    async with serving(agent=None, scripted_pace=0.0) as demo, connect(demo.url) as conv:
        answer = "".join([d async for d in conv.say(CANCEL)])
    assert answer == (
        "I didn't cancel order 1234: declined by the user: this client cannot ask the user."
    )


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
async def test_the_js_sdk_approves_and_declines_what_the_user_decides():
    result = await run_js(Path(__file__).parent / "js" / "live_confirm.mjs")
    assert result["approved"] == DONE
    assert result["declined"] == (
        "I didn't cancel order 1234: declined by the user: I still want it."
    )
    assert result["asked"] == [["cancel_order", "Cancel order 1234?", "server"]] * 2


@pytest.mark.slow  # a real Chromium, as the web demo's tests
async def test_the_web_demo_asks_with_a_card_and_approve_runs_the_tool():
    async with (
        serving(agent=None, scripted_pace=0.0) as demo,
        open_page(demo, "test_the_web_demo_asks_with_a_card_and_approve_runs_the_tool") as page,
    ):
        await send(page, CANCEL)
        card = page.locator("div.confirm")
        await expect(card).to_have_attribute("data-status", "asking")
        await expect(card.locator(".confirm-prompt")).to_have_text("Cancel order 1234?")
        await card.locator("button.confirm-approve").click()
        await expect(card).to_have_attribute("data-status", "approved")
        await expect(last_answer(page)).to_contain_text(DONE)

"""The web demo as people use it, in a real headless Chromium at 1280x800 and 390x844: the chat
follows the conversation, the header holds together on a phone, one banner per outage that goes
away (with Retry now, and a queued mark on what is sent meanwhile), one card per approved action,
values and errors as people read them, Markdown drawn with the model's HTML escaped, New chat,
an inspector that survives a reload, chips that fade where they scroll, and the small things
(the keyboard hint, the composer's focus, the tools panel under auth). Screenshots go to
test-output/."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Page, ViewportSize, expect
from playwright.async_api import TimeoutError as PlaywrightTimeout

from tests.browser import (
    BROWSER_TESTS,
    DESKTOP,
    GREETING,
    PHONE,
    VIEWPORTS,
    SocketGate,
    answered,
    base_url,
    last_answer,
    open_page,
    send,
)
from tests.support import Gateway, serving

pytestmark = BROWSER_TESTS  # a real Chromium, shared by the module's tests


@pytest_asyncio.fixture(loop_scope="session")
async def demo(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "3")
    async with serving(agent=None, scripted_pace=0.02) as gateway:
        yield gateway


@pytest.fixture(params=list(VIEWPORTS), ids=list(VIEWPORTS))
def viewport(request: pytest.FixtureRequest) -> ViewportSize:
    """Run the test at 1280x800 and at 390x844."""
    return VIEWPORTS[request.param]


def shot(request: pytest.FixtureRequest) -> str:
    return str(request.node.name)


async def cut(gateway: Gateway) -> None:
    """Close the page's socket from the gateway's side (1013: the client resumes)."""
    (driver,) = gateway.runtime.drivers.values()
    assert driver.connection is not None
    driver.connection.close(1013, "cut by the test")


# ---- The chat follows the conversation ----------------------------------------------------------

FROM_BOTTOM = """() => {
    // How far the newest message's bottom is below what the conversation shows (0: in view).
    const scroller = document.querySelector("#chat-scroll");
    const newest = document.querySelector("#messages").lastElementChild;
    const shown = scroller.getBoundingClientRect().bottom;
    return {
        scroll: Math.round(scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight),
        newest: newest ? Math.round(newest.getBoundingClientRect().bottom - shown) : 0,
    };
}"""


AT_NEWEST = f"() => {{ const d = ({FROM_BOTTOM})(); return d.scroll <= 2 && d.newest <= 2; }}"


async def assert_at_newest(page: Page) -> None:
    """The view reaches the newest message: it follows at the next frame after a change (the
    ResizeObserver's), so this waits for that, a few seconds at most."""
    try:
        await page.wait_for_function(AT_NEWEST, timeout=5_000)
    except PlaywrightTimeout:
        raise AssertionError(await page.evaluate(FROM_BOTTOM)) from None


async def test_the_chat_follows_every_reply_card_and_question(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, shot(request), viewport) as page:
        # A result card of four rows first: it used to leave the view behind for good.
        for text in [
            "do you have headphones in stock?",
            "hello",
            "nearest store to 92031",
            "what's my battery level?",
            "hello",
        ]:
            await answered(page, text)
            await assert_at_newest(page)
        # A question card (a widget) waits for the user: it is in view too.
        await send(page, "which store should I pick up from?")
        widget = page.locator("div.widget").last
        await expect(widget).to_have_attribute("data-status", "asking")
        await expect(widget.locator("button.widget-option").first).to_be_enabled()
        await assert_at_newest(page)
        await widget.locator("button.widget-option").first.click()
        await expect(last_answer(page)).to_have_attribute("data-state", "done")
        await assert_at_newest(page)
        # Opening a card's JSON grows the card: the view follows it.
        await page.locator("details.json summary").last.click()
        await expect(page.locator("details.json pre").last).to_be_visible()
        await assert_at_newest(page)
        await expect(page.locator("#to-latest")).to_be_hidden()


async def test_reading_further_up_is_left_alone_and_new_messages_offer_a_button(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, shot(request), viewport) as page:
        for text in ["hello", "do you have headphones in stock?", "nearest store to 92031"]:
            await answered(page, text)
        await answered(page, "where is my order 1234?")  # its result comes 3 s later
        chip = page.locator(".chip.async").last
        scroller = page.locator("#chat-scroll")
        await scroller.hover()
        await page.mouse.wheel(0, -3000)  # the user scrolls up to read
        await page.wait_for_function("document.querySelector('#chat-scroll').scrollTop === 0")
        assert await chip.get_attribute("data-status") != "completed", "the result came too soon"
        # The result lands below, as an async update: the view stays where the user reads.
        await expect(page.locator(".msg.assistant.async-update")).to_have_count(1, timeout=15_000)
        await expect(page.locator("#to-latest")).to_be_visible()
        assert await scroller.evaluate("(s) => s.scrollTop") == 0
        await page.locator("#to-latest").click()
        await expect(page.locator("#to-latest")).to_be_hidden()
        await assert_at_newest(page)
        # Sending always goes to the newest message, wherever the user was.
        await scroller.hover()
        await page.mouse.wheel(0, -3000)
        await page.wait_for_function("document.querySelector('#chat-scroll').scrollTop === 0")
        await answered(page, "hello")
        await assert_at_newest(page)


# ---- The header ---------------------------------------------------------------------------------

HEADER_PROBLEMS = """() => {
    const names = ["h1", "#connection", "#new-chat", "#open-settings"];
    const boxes = names.map((name) => [
        name, document.querySelector(`.app-header ${name}`).getBoundingClientRect(),
    ]);
    const out = [];
    for (const [name, box] of boxes) {
        if (box.width === 0) out.push(`${name} not shown`);
        if (box.left < -0.5 || box.right > window.innerWidth + 0.5) out.push(`${name} off screen`);
    }
    for (let i = 0; i < boxes.length; i++) {
        for (let j = i + 1; j < boxes.length; j++) {
            const [[a, p], [b, q]] = [boxes[i], boxes[j]];
            const overlap = Math.min(p.right, q.right) - Math.max(p.left, q.left);
            const vertical = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
            if (overlap > 0.5 && vertical > 0.5) out.push(`${a} overlaps ${b}: ${overlap} px`);
        }
    }
    const title = document.querySelector(".app-header h1");
    if (title.scrollWidth > title.clientWidth + 1) out.push("the title is cut");
    if (title.getClientRects().length !== 1) out.push("the title wraps");
    return out;
}"""


async def test_the_header_holds_together_in_every_connection_state(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    gate = SocketGate()
    async with open_page(demo, shot(request), viewport, gate=gate) as page:
        pill = page.locator("#connection")
        assert await page.evaluate(HEADER_PROBLEMS) == []
        await answered(page, "hello")  # the session exists (the pill says open before that)
        await cut(demo)  # resumed once: the longest label the pill had ("resumed 1 time")
        await expect(pill).to_have_attribute("data-reconnects", "1")
        await expect(pill).to_have_attribute("data-state", "open")
        assert await page.evaluate(HEADER_PROBLEMS) == []
        gate.down = True
        await cut(demo)
        await expect(pill).to_have_attribute("data-state", "reconnecting")
        await gate.refusals(1)
        assert await page.evaluate(HEADER_PROBLEMS) == []
        await page.context.set_offline(True)
        await expect(pill).to_have_attribute("data-state", "offline")
        assert await page.evaluate(HEADER_PROBLEMS) == []
        gate.down = False
        await page.context.set_offline(False)
        await expect(pill).to_have_attribute("data-state", "open")
        await expect(pill).to_have_attribute("data-reconnects", "2")
        assert await page.evaluate(HEADER_PROBLEMS) == []


# ---- One banner per outage ----------------------------------------------------------------------


async def test_an_outage_is_one_banner_that_goes_away_and_nothing_in_the_transcript(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    gate = SocketGate()
    async with open_page(demo, shot(request), viewport, gate=gate) as page:
        banner = page.locator("#banner")
        await answered(page, "hello")
        for outage in (1, 2):
            gate.down = True
            await cut(demo)
            await expect(banner).to_have_attribute("data-state", "reconnecting")
            await expect(banner).to_contain_text("Reconnecting")
            await expect(banner.locator("button", has_text="Retry now")).to_be_visible()
            await gate.refusals(2 * outage)  # the outage lasts: attempts fail, the banner stays
            await expect(banner).to_have_attribute("data-state", "reconnecting")
            gate.down = False
            await expect(banner).to_have_attribute("data-state", "back")
            await expect(banner).to_contain_text("Back online")
            await expect(banner).to_be_hidden()  # it goes away by itself
            await expect(banner).to_have_attribute("data-outages", str(outage))
        await expect(page.locator("#banner")).to_have_count(1)
        # Nothing about the connection landed in the conversation.
        await expect(page.locator("#messages .msg.system")).to_have_count(0)
        await expect(page.locator("#messages")).not_to_contain_text("onnection")
        await expect(page.locator("#connection")).to_have_attribute("data-reconnects", "2")


async def test_a_message_sent_while_away_is_queued_then_sent_once(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    gate = SocketGate()
    async with open_page(demo, shot(request), viewport, gate=gate) as page:
        await answered(page, "hello")
        gate.down = True
        await cut(demo)
        await expect(page.locator("#banner")).to_have_attribute("data-state", "reconnecting")
        await gate.refusals(2)
        # Sent while away: shown at once, marked queued, sent by the SDK on the resume.
        await send(page, "nearest store to 92031")
        mine = page.locator(".msg.user").last
        await expect(mine).to_have_attribute("data-queued", "true")
        await expect(mine).to_contain_text("Queued")
        gate.down = False
        await expect(mine).not_to_have_attribute("data-queued", "true")
        await expect(mine).not_to_contain_text("Queued")
        answer = last_answer(page)
        await expect(answer).to_have_attribute("data-state", "done")
        await expect(answer).to_contain_text("The nearest store to 92031 is Vista")
        await expect(page.locator(".msg.user")).to_have_count(2)  # sent once, shown once
        await expect(page.locator(".msg.assistant")).to_have_count(2)
        await expect(page.locator("#banner")).to_be_hidden()


CLICK_RETRY = """() => {
    const button = document.querySelector("#banner [data-banner-action=retry]");
    button?.click();
    return Boolean(button);
}"""


async def test_retry_now_reconnects_at_once(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    gate = SocketGate()
    async with open_page(demo, shot(request), viewport, gate=gate) as page:
        banner = page.locator("#banner")
        retry = banner.locator("button", has_text="Retry now")
        await answered(page, "hello")  # the session exists (the pill says open before that)
        # The button is clicked the moment the outage ends; should the SDK's own next attempt
        # (up to 2 s later) ever beat the click, that outage proves nothing: another one.
        for outage in range(1, 4):
            gate.down = True
            await cut(demo)
            await expect(banner).to_have_attribute("data-state", "reconnecting")
            await expect(retry).to_be_visible()
            await gate.refusals(3 * outage)
            gate.down = False
            clicked = await page.evaluate(CLICK_RETRY)
            await expect(banner).to_have_attribute("data-state", "back")
            await expect(banner).to_be_hidden()
            if clicked:
                break
        assert clicked
        await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
        await expect(page.locator(".msg.assistant")).to_have_count(1)  # nothing said meanwhile
        await answered(page, "hello")


async def test_going_offline_and_back_is_one_banner(page_at: Page):
    banner = page_at.locator("#banner")
    await page_at.context.set_offline(True)
    await expect(banner).to_have_attribute("data-state", "offline")
    await expect(banner).to_contain_text("offline")
    await page_at.context.set_offline(False)
    await expect(banner).to_have_attribute("data-state", "back")
    await expect(banner).to_be_hidden()
    await expect(banner).to_have_attribute("data-outages", "1")
    await expect(page_at.locator("#messages .msg.system")).to_have_count(0)
    await send(page_at, "hello")
    await expect(last_answer(page_at)).to_contain_text(GREETING)


@pytest_asyncio.fixture(loop_scope="session")
async def page_at(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
) -> AsyncIterator[Page]:
    """The demo page at the test's size."""
    async with open_page(demo, shot(request), viewport) as page:
        yield page


# ---- Cards --------------------------------------------------------------------------------------


async def test_an_approved_action_is_one_card_whose_state_changes(page_at: Page):
    await send(page_at, "cancel my order 1234")
    card = page_at.locator("div.confirm")
    await expect(card).to_have_attribute("data-status", "asking")
    call_id = await card.get_attribute("data-call-id")
    await card.locator("button.confirm-approve").click()
    answer = last_answer(page_at)
    await expect(answer).to_have_attribute("data-state", "done")
    await expect(answer).to_contain_text("Done: order 1234 is cancelled.")
    # One card for the call: the question, then its run and result on the same card.
    await expect(answer.locator(f'[data-call-id="{call_id}"]')).to_have_count(1)
    await expect(answer.locator(".activity")).to_have_count(0)
    await expect(card).to_have_attribute("data-status", "approved")
    await expect(card).to_have_attribute("data-run", "completed")
    await expect(card.locator(".activity-state")).to_have_text("✓ done")
    result = card.locator(".activity-result .kv")
    await expect(result.locator('dt[data-key="cancelled"]')).to_have_text("Cancelled")
    await expect(result.locator('dd[data-key="cancelled"]')).to_have_text("yes")


async def test_cards_show_values_and_errors_as_people_read_them(page_at: Page):
    stock = await answered(page_at, "do you have headphones in stock?")
    await expect(stock.locator('.kv dt[data-key="in_stock"]')).to_have_text("In stock")
    store = await answered(page_at, "nearest store to 92031")
    await expect(store.locator('.kv dt[data-key="distance_km"]')).to_have_text("Distance")
    await expect(store.locator('.kv dd[data-key="distance_km"]')).to_have_text("0 km")
    await expect(store.locator(".activity-args")).to_have_text("Zip code 92031")
    battery = await answered(page_at, "what's my battery level?")
    level = battery.locator('.kv dd[data-key="level"]')
    await expect(level).to_have_text(re.compile(r"^\d{1,3}%$"))
    said = re.search(r"at (\d+%)", await battery.inner_text())
    assert said is not None
    await expect(level).to_have_text(said[1])  # the card and the reply agree
    # No key of any card shows as snake_case.
    for label in await page_at.locator(".kv dt").all_inner_texts():
        assert "_" not in label, label
    # A client function that throws: its message, without JavaScript's "Error: " in front.
    await page_at.locator("#open-settings").click()
    await page_at.locator("#set-battery").uncheck()
    await page_at.locator("#settings-close").click()
    refused = await answered(page_at, "what's my battery level?")
    error = refused.locator(".activity-error")
    await expect(error).to_have_text(
        "The user has turned off battery access in this app's privacy settings"
    )
    await expect(refused).not_to_contain_text("Error:")
    await expect(refused).to_contain_text(
        "I couldn't read the battery level: The user has turned off battery access"
    )


# ---- Markdown -----------------------------------------------------------------------------------

MARKDOWN = (
    "Here is **what I found** about *your order*:\n\n"
    "- first item with `inline code`\n"
    "- second item\n\n"
    "1. one\n"
    "2. two\n\n"
    "```python\nprint(1 < 2)\n```\n\n"
    'A [link](https://example.com) and <img src=x onerror="window.pwned = 1"> '
    "<script>window.pwned = 2</script> <b>not bold</b>."
)


@pytest_asyncio.fixture(loop_scope="session")
async def markdown_gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        'pace = 0.01\nfallback = "fallback"\n\n[[rules]]\n'
        f"match = '^markdown$'\nsay = {json.dumps(MARKDOWN)}\n"  # JSON's escapes are TOML's
    )
    agent = tmp_path / "agent.toml"
    agent.write_text(f'name = "writer"\n[model]\nprovider = "scripted"\nscenario = "{scenario}"\n')
    async with serving(agent=str(agent)) as gateway:
        yield gateway


async def test_a_reply_is_markdown_drawn_with_the_models_html_escaped(
    markdown_gateway: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    perms = ["clipboard-read", "clipboard-write"]
    async with open_page(markdown_gateway, shot(request), viewport, permissions=perms) as page:
        answer = await answered(page, "markdown")
        text = answer.locator(".msg-text")
        await expect(text.locator("strong")).to_have_text("what I found")
        await expect(text.locator("em")).to_have_text("your order")
        await expect(text.locator("ul > li")).to_have_count(2)
        await expect(text.locator("ol > li")).to_have_text(["one", "two"])
        await expect(text.locator("li code")).to_have_text("inline code")
        await expect(text.locator("pre code")).to_have_text("print(1 < 2)")
        link = text.locator("a")
        await expect(link).to_have_attribute("href", re.compile(r"^https://example\.com/?$"))
        await expect(link).to_have_attribute("rel", re.compile("noopener"))
        # The model's HTML is text: shown as written, never markup, never run.
        await expect(text.locator("img, script, b")).to_have_count(0)
        await expect(text).to_contain_text('<img src=x onerror="window.pwned = 1">')
        await expect(text).to_contain_text("<script>window.pwned = 2</script>")
        assert await page.evaluate("window.pwned") is None
        # Copy gives the reply as the model wrote it.
        await answer.locator("button.msg-copy").click()
        await expect(answer.locator("button.msg-copy")).to_have_text("✓ Copied")
        copied = await page.evaluate("navigator.clipboard.readText()")
        assert copied == MARKDOWN
        # A reload draws it the same (the Markdown is kept with the conversation).
        await page.reload()
        await expect(page.locator("#banner")).to_have_attribute("data-state", "restored")
        await expect(last_answer(page).locator(".msg-text strong")).to_have_text("what I found")
        await expect(last_answer(page).locator(".msg-text img")).to_have_count(0)


# ---- New chat, and the inspector across a reload ------------------------------------------------


async def test_new_chat_ends_the_session_and_starts_a_fresh_one(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, shot(request), viewport) as page:
        await answered(page, "nearest store to 92031")
        (old,) = demo.runtime.drivers
        await page.locator("#new-chat").click()
        await expect(page.locator("#messages > li")).to_have_count(0)
        await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
        await expect(page.locator("#composer")).to_be_focused()
        answer = await answered(page, "hello")
        await expect(answer).to_contain_text(GREETING)
        (new,) = demo.runtime.drivers  # the old session ended on the gateway
        assert new != old
        await expect(page.locator("#messages .msg.user")).to_have_count(1)
        await expect(page.locator("#banner")).to_be_hidden()
        await expect(page.locator(".call")).to_have_count(0)  # the inspector starts afresh too
        # A reload resumes the new session, not the old one.
        await page.reload()
        await expect(page.locator("#banner")).to_have_attribute("data-state", "restored")
        await expect(page.locator("#messages .msg.user")).to_have_text(["hello"])
        assert list(demo.runtime.drivers) == [new]


async def test_the_inspector_survives_a_reload(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, shot(request), viewport) as page:
        await answered(page, "nearest store to 92031")
        tab = "#tab-inspector" if viewport["width"] < 900 else "#side-tab-inspector"
        await page.locator(tab).click()
        events = page.locator("#inspector .event")
        before = await events.count()
        assert before > 5
        calls = page.locator("#call-list .call")
        await expect(calls).to_have_count(1)
        steps = await calls.locator(".step").all_inner_texts()
        await page.reload()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
        await page.locator(tab).click()
        await expect(events.first).to_be_attached()
        assert await events.count() >= before
        await expect(calls).to_have_count(1)
        assert await calls.locator(".step").all_inner_texts() == steps
        await expect(page.locator("#event-count")).not_to_have_text("0 events")


# ---- The little things --------------------------------------------------------------------------

CHIPS = """() => {
    const row = document.querySelector("#suggestions");
    const chips = [...row.querySelectorAll(".suggestion")];
    const cut = chips.filter((c) => c.scrollWidth > c.clientWidth + 1);
    return {
        overflows: row.scrollWidth > row.clientWidth + 1,
        more: row.dataset.more ?? null,
        mask: getComputedStyle(row).maskImage,
        cutInside: cut.map((c) => c.textContent),
    };
}"""


async def test_suggestion_chips_fade_where_there_are_more(page_at: Page):
    row = page_at.locator("#suggestions")
    await expect(row.locator(".suggestion").first).to_be_visible()
    chips = await page_at.evaluate(CHIPS)
    assert chips["cutInside"] == []  # a chip's own label is never cut
    assert chips["overflows"], chips  # eight prompts do not fit on one line at either size
    assert chips["more"] == "right"
    assert chips["mask"] != "none"
    await row.evaluate("(r) => r.scrollTo({ left: r.scrollWidth })")
    await expect(row).to_have_attribute("data-more", "left")
    await row.evaluate("(r) => r.scrollTo({ left: r.scrollWidth / 3 })")
    await expect(row).to_have_attribute("data-more", "both")


async def test_the_keyboard_hint_is_for_keyboards_and_the_composer_is_ready(
    page_at: Page, viewport: ViewportSize
):
    await expect(page_at.locator("#composer")).to_be_focused()
    hint = page_at.locator("#composer-hint")
    if viewport == PHONE:  # a touch screen (has_touch, is_mobile)
        await expect(hint).to_be_hidden()
    else:
        assert viewport == DESKTOP
        await expect(hint).to_be_visible()


async def test_with_auth_on_the_tools_panel_runs_a_tool_with_an_api_key():
    key = "backend-key-0123456789abcdef"
    auth = {"no_auth": False, "api_keys": f"backend:{key}", "token_secret": "s" * 40}
    async with serving(agent=None, scripted_pace=0, **auth) as gateway:
        base = base_url(gateway)
        async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
            minted = await client.post(
                "/v1/sessions", json={"origin": base}, headers={"authorization": f"Bearer {key}"}
            )
        token = minted.json()["token"]
        path = f"/?token={token}"
        async with open_page(gateway, "test_with_auth_on_the_tools_panel", path=path) as page:
            sent: list[str | None] = []
            page.on(
                "request",
                lambda r: sent.append(r.headers.get("authorization")) if "/test" in r.url else None,
            )
            tool = page.locator('.tool[data-tool="check_stock"]')
            await tool.locator("button.tool-run").click()
            output = tool.locator(".tool-output")
            # The page's own token went (it is refused there: running a tool takes a key).
            await expect(output).to_have_attribute("data-ok", "false")
            assert sent == [f"Bearer {token}"]
            await expect(output).to_contain_text("API key")
            await output.locator("input.tool-key").fill(key)
            await output.locator("button.tool-key-use").click()
            await expect(output).to_have_attribute("data-ok", "true")
            await expect(output.locator('.kv dt[data-key="in_stock"]')).to_be_visible()
            assert sent == [f"Bearer {token}", f"Bearer {key}"]


async def test_the_demo_agent_answers_what_it_can_do_in_markdown(page_at: Page):
    answer = await answered(page_at, "what can you do?")
    text = answer.locator(".msg-text")
    await expect(text.locator("strong").first).to_have_text("what I can do")
    await expect(text.locator("ul > li")).to_have_count(3)
    await expect(text.locator("code")).to_have_text(
        ["nearest store to 92031", "where is my order 1234?"]
    )
    await expect(text).not_to_contain_text("**")

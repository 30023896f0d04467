"""The web demo in a real headless Chromium (Debian's, driven by Playwright) against a gateway
on a free port. Every test leaves a screenshot in test-output/."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Page, ViewportSize, expect

from tests.browser import (
    BROWSER_TESTS,
    GREETING,
    PHONE,
    VIEWPORTS,
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
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "1.5")
    async with serving(agent=None, scripted_pace=0.04) as gateway:
        yield gateway


@pytest.fixture(params=list(VIEWPORTS), ids=list(VIEWPORTS))
def viewport(request: pytest.FixtureRequest) -> ViewportSize:
    """Run the test at 1280x800 and at 390x844."""
    return VIEWPORTS[request.param]


@pytest_asyncio.fixture(loop_scope="session")
async def page(demo: Gateway, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    async with open_page(demo, request.node.name) as page:
        yield page


STREAMING_WITH_TEXT = """() => {
    const m = [...document.querySelectorAll('.msg.assistant')].pop();
    return m && m.dataset.state === 'streaming' && m.textContent.trim().length > 0;
}"""


async def test_streamed_text_appears_before_the_response_ends(page: Page):
    await send(page, "hello")
    answer = last_answer(page)
    # Caught mid-stream: some text shown while the response is still streaming.
    await page.wait_for_function(STREAMING_WITH_TEXT)
    await expect(answer).to_have_attribute("data-state", "done")
    await expect(answer).to_contain_text(GREETING)


async def test_open_the_settings_opens_the_panel_through_a_client_function(page: Page):
    await expect(page.locator("#settings-panel")).to_be_hidden()
    await send(page, "open the settings")
    await expect(page.locator("#settings-panel")).to_be_visible()
    await expect(last_answer(page)).to_contain_text("The settings are open.")


async def test_an_order_lookup_shows_a_pending_chip_that_turns_into_the_result(page: Page):
    await send(page, "where is my order 1234?")
    chip = page.locator(".chip.async").first
    await expect(chip).to_have_attribute("data-status", re.compile("pending|progress"))
    await expect(last_answer(page)).to_have_attribute("data-state", "done")
    await send(page, "hello")  # the user chats on while the lookup runs
    await expect(chip).to_have_attribute("data-status", "completed", timeout=15_000)
    await expect(chip).to_contain_text("on its way")
    await expect(page.locator(".msg.assistant").filter(has_text=GREETING)).to_have_count(1)


async def test_the_page_resumes_a_cut_socket_without_losing_or_repeating_text(
    page: Page, demo: Gateway
):
    await send(page, "hello")
    await page.wait_for_function(
        """() => { const m = [...document.querySelectorAll('.msg.assistant')].pop();
                   return m && m.textContent.trim().length > 0; }"""
    )
    (driver,) = demo.runtime.drivers.values()
    assert driver.connection is not None
    driver.connection.close(1013, "cut by the test")
    await expect(page.locator("#connection")).to_have_attribute("data-reconnects", "1")
    await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
    answer = last_answer(page)
    await expect(answer).to_have_attribute("data-state", "done")
    text = " ".join((await answer.inner_text()).split())
    assert text.count("Hello!") == 1
    assert GREETING in text


async def test_the_tools_panel_runs_a_server_tool(page: Page):
    tool = page.locator('.tool[data-tool="check_stock"]')
    await tool.locator("textarea.tool-input").fill('{"product": "headphones"}')
    await tool.locator("button.tool-run").click()
    output = tool.locator(".tool-output")
    await expect(output).to_have_attribute("data-ok", "true")
    await expect(output).to_contain_text("in_stock")
    client = page.locator('.tool[data-tool="get_battery_level"]')
    await expect(client.locator("button.tool-run")).to_have_count(0)


async def test_on_a_phone_sized_screen_by_keyboard(demo: Gateway):
    async with open_page(demo, "test_on_a_phone_sized_screen", PHONE) as page:
        await page.locator("#composer").focus()
        await page.keyboard.type("nearest store to 92031")
        await page.keyboard.press("Enter")
        await expect(last_answer(page)).to_contain_text("The nearest store to 92031 is Vista")
        await page.locator("#tab-tools").click()
        tool = page.locator('.tool[data-tool="check_stock"]')
        await expect(tool).to_be_visible()
        await tool.locator("button.tool-run").click()
        await expect(tool.locator(".tool-output")).to_have_attribute("data-ok", "true")


async def test_the_page_connects_with_a_dev_token(page: Page, demo: Gateway):
    # The pill says "open" once the socket is; the session exists once session.start is
    # read, which may come a moment later. The runtime has no event for a new session:
    # polled, with a deadline.
    async with asyncio.timeout(10):
        while not demo.runtime.drivers:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    (driver,) = demo.runtime.drivers.values()
    principal = driver.session.principal
    assert (principal.name, principal.kind) == ("key:dev", "client_token")
    # The dev token is bound to the page's own origin.
    assert principal.origin == base_url(demo)


async def test_with_auth_on_the_page_connects_with_a_token_from_its_url():
    key = "backend-key-0123456789abcdef"
    auth = {"no_auth": False, "api_keys": f"backend:{key}", "token_secret": "s" * 40}
    async with serving(agent=None, scripted_pace=0, **auth) as gateway:
        base = base_url(gateway)
        async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
            minted = await client.post(
                "/v1/sessions",
                json={"origin": base, "user": {"id": "demo-user"}},
                headers={"authorization": f"Bearer {key}"},
            )
            anonymous = await client.get("/v1/agent")
        assert minted.status_code == 201
        assert anonymous.status_code == 401  # like GET /v1/tools: a key or a token
        path = f"/?token={minted.json()['token']}"
        async with open_page(gateway, "test_with_auth_on_the_page", path=path) as page:
            assert "token" not in page.url  # removed from the address bar at once
            await expect(page.locator('.tool[data-tool="check_stock"]')).to_be_visible()
            await expect(page.locator(".suggestion")).to_have_count(8)  # GET /v1/agent, token
            await send(page, "hello")
            await expect(last_answer(page)).to_contain_text(GREETING)
            (driver,) = gateway.runtime.drivers.values()
            assert driver.session.principal.name == "key:backend/user:demo-user"
            await page.reload()  # the token was kept for this tab: the session resumes
            await expect(page.locator("#banner")).to_contain_text("restored after the reload")
            await expect(last_answer(page)).to_contain_text(GREETING)
            assert list(gateway.runtime.drivers) == [driver.session_id]


# ---- Layout and rendering, at 1280x800 and 390x844 ----------------------------------------------

BEFORE = """([first, second]) => {
    const position = first.compareDocumentPosition(second);
    return Boolean(position & Node.DOCUMENT_POSITION_FOLLOWING);
}"""

OVERFLOWING = """() => {
    // What sticks out on the right: the page itself, or any visible element (the suggestion
    // chips excepted: they are a row that scrolls sideways on purpose).
    const width = window.innerWidth;
    const page = document.documentElement.scrollWidth;
    const out = page > width ? [`page ${page}`] : [];
    for (const node of document.querySelectorAll("body *")) {
        if (node.closest(".suggestions, [hidden]")) continue;
        const box = node.getBoundingClientRect();
        if (box.width === 0 || box.height === 0) continue;
        const name = `${node.tagName}.${node.className}`;
        if (box.right > width + 0.5) out.push(`${name} ${Math.round(box.right)}`);
        const sideways = ["auto", "scroll"].includes(getComputedStyle(node).overflowX);
        if (sideways && node.scrollWidth > node.clientWidth + 1) out.push(`${name} scrolls`);
    }
    return out;
}"""


async def assert_nothing_overflows(page: Page) -> None:
    assert await page.evaluate(OVERFLOWING) == []


async def test_a_tool_row_comes_before_the_text_that_follows_it(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, request.node.name, viewport) as page:
        answer = await answered(page, "nearest store to 92031")
        row = answer.locator('.activity[data-tool="get_nearest_store"]')
        text = answer.locator(".msg-text", has_text="The nearest store to 92031 is Vista")
        assert await page.evaluate(
            BEFORE, [await row.element_handle(), await text.element_handle()]
        )
        answer = await answered(page, "open the settings")
        await page.locator("#settings-close").click()
        said = answer.locator(".msg-text", has_text="Sure, opening the settings.")
        row = answer.locator('.activity[data-tool="open_settings"]')
        after = answer.locator(".msg-text", has_text="The settings are open.")
        handles = [await said.element_handle(), await row.element_handle()]
        assert await page.evaluate(BEFORE, handles)
        handles = [await row.element_handle(), await after.element_handle()]
        assert await page.evaluate(BEFORE, handles)


async def test_nothing_overflows_sideways_on_a_phone(demo: Gateway):
    async with open_page(demo, "test_nothing_overflows_sideways_on_a_phone", PHONE) as page:
        for text in ["do you have headphones in stock?", "nearest store to 92031", "hello"]:
            await answered(page, text)
        await expect(page.locator('.activity[data-tool="check_stock"]')).to_have_attribute(
            "data-status", "completed"
        )
        await assert_nothing_overflows(page)
        await page.locator("#tab-tools").click()
        tool = page.locator('.tool[data-tool="check_stock"]')
        await tool.locator("button.tool-run").click()
        await expect(tool.locator(".tool-output")).to_have_attribute("data-ok", "true")
        await assert_nothing_overflows(page)
        await page.locator("#tab-inspector").click()
        await page.locator("#inspector .event").last.locator("summary").click()
        await assert_nothing_overflows(page)


async def test_a_tool_result_is_a_card_with_its_json_on_demand(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, request.node.name, viewport) as page:
        answer = await answered(page, "do you have headphones in stock?")
        row = answer.locator('.activity[data-tool="check_stock"]')
        await expect(row).to_have_attribute("data-status", "completed")
        card = row.locator(".kv")
        await expect(card.locator('dt[data-key="in_stock"]')).to_have_text("In stock")
        await expect(card.locator("dd").first).to_be_visible()
        raw = row.locator("details.json pre")
        await expect(raw).to_be_hidden()
        await row.locator("details.json summary").click()
        await expect(raw).to_be_visible()
        await expect(raw).to_contain_text('"in_stock": true')


async def test_the_tools_panel_shows_a_result_without_scrolling(demo: Gateway):
    async with open_page(demo, "test_the_tools_panel_shows_a_result_without_scrolling") as page:
        panel = page.locator("#tools-panel")
        box = await panel.bounding_box()
        assert box is not None
        assert box["height"] >= 0.7 * 800, box
        for name in ["check_stock", "check_order_status"]:
            tool = page.locator(f'.tool[data-tool="{name}"]')
            await tool.locator("button.tool-run").click()
            output = tool.locator(".tool-output")
            await expect(output).to_have_attribute("data-ok", "true")
            await expect(output.locator(".kv")).to_be_visible()
            await expect(output).to_be_in_viewport(ratio=1)
            body = await page.locator("#tools-panel .panel-body").bounding_box()
            shown = await output.bounding_box()
            assert body is not None
            assert shown is not None
            assert body["y"] <= shown["y"]
            assert shown["y"] + shown["height"] <= body["y"] + body["height"]


async def test_the_inspector_hides_text_deltas_until_asked(
    demo: Gateway, viewport: ViewportSize, request: pytest.FixtureRequest
):
    async with open_page(demo, request.node.name, viewport) as page:
        await answered(page, "hello")
        tab = "#tab-inspector" if viewport["width"] < 900 else "#side-tab-inspector"
        await page.locator(tab).click()
        deltas = page.locator('#inspector .event[data-type="text.delta"]')
        assert await deltas.count() > 3
        await expect(page.locator('#inspector .event[data-type="response.done"]')).to_be_visible()
        await expect(deltas.first).to_be_hidden()
        await expect(page.locator("#show-deltas")).not_to_be_checked()
        await page.locator("#show-deltas").check()
        await expect(deltas.first).to_be_visible()


async def test_the_pill_says_offline_while_the_browser_is(page: Page):
    pill = page.locator("#connection")
    await page.context.set_offline(True)
    await expect(pill).to_have_attribute("data-state", "offline")
    await expect(pill).to_contain_text("Offline")
    await page.context.set_offline(False)
    await expect(pill).to_have_attribute("data-state", "open")
    await expect(pill).to_contain_text("Connected")
    await send(page, "hello")
    await expect(last_answer(page)).to_contain_text(GREETING)

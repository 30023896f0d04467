"""The web demo in a real headless Chromium (Debian's, driven by Playwright) against a gateway
on a free port. Every test leaves a screenshot in test-output/."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, async_playwright, expect

from tests.support import Gateway, serving

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SHOTS = Path(__file__).parents[1] / "test-output"
GREETING = (
    "Hello! I can open your settings, check your battery, find the nearest store, "
    "check stock, or track an order. What would you like?"
)


@pytest.fixture
async def demo(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "1.5")
    async with serving(agent=None, scripted_pace=0.04) as gateway:
        yield gateway


@pytest.fixture
async def page(demo: Gateway, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(demo.url.replace("ws://", "http://").removesuffix("/v1/realtime") + "/")
        await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
        try:
            yield page
        finally:
            SHOTS.mkdir(exist_ok=True)
            await page.screenshot(path=SHOTS / f"{request.node.name}.png", full_page=True)
            await browser.close()


async def send(page: Page, text: str) -> None:
    await page.locator("#composer").fill(text)
    await page.locator("#composer").press("Enter")


STREAMING_WITH_TEXT = """() => {
    const m = [...document.querySelectorAll('.msg.assistant')].pop();
    return m && m.dataset.state === 'streaming' && m.textContent.trim().length > 0;
}"""


def last_answer(page: Page):  # type: ignore[no-untyped-def]
    return page.locator(".msg.assistant").last


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
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        page = await browser.new_page(viewport={"width": 375, "height": 667}, is_mobile=True)
        try:
            await page.goto(demo.url.replace("ws://", "http://").removesuffix("/v1/realtime") + "/")
            await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
            await page.locator("#composer").focus()
            await page.keyboard.type("nearest store to 92031")
            await page.keyboard.press("Enter")
            await expect(last_answer(page)).to_contain_text("The nearest store to 92031 is Vista")
            await page.locator("#tab-tools").click()
            tool = page.locator('.tool[data-tool="check_stock"]')
            await expect(tool).to_be_visible()
            await tool.locator("button.tool-run").click()
            await expect(tool.locator(".tool-output")).to_have_attribute("data-ok", "true")
        finally:
            SHOTS.mkdir(exist_ok=True)
            await page.screenshot(path=SHOTS / "test_on_a_phone_sized_screen.png")
            await browser.close()


async def test_the_page_connects_with_a_dev_token(page: Page, demo: Gateway):
    (driver,) = demo.runtime.drivers.values()
    principal = driver.session.principal
    assert (principal.name, principal.kind) == ("key:dev", "client_token")
    # The dev token is bound to the page's own origin.
    assert principal.origin == demo.url.replace("ws://", "http://").removesuffix("/v1/realtime")


async def test_with_auth_on_the_page_connects_with_a_token_from_its_url():
    key = "backend-key-0123456789abcdef"
    auth = {"no_auth": False, "api_keys": f"backend:{key}", "token_secret": "s" * 40}
    async with serving(agent=None, scripted_pace=0, **auth) as gateway:
        base = gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")
        async with httpx.AsyncClient(base_url=base, trust_env=False) as client:
            minted = await client.post(
                "/v1/sessions",
                json={"origin": base, "user": {"id": "demo-user"}},
                headers={"authorization": f"Bearer {key}"},
            )
        assert minted.status_code == 201
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=FLAGS
            )
            page = await browser.new_page()
            try:
                await page.goto(f"{base}/?token={minted.json()['token']}")
                await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
                assert "token" not in page.url  # removed from the address bar at once
                await expect(page.locator('.tool[data-tool="check_stock"]')).to_be_visible()
                await send(page, "hello")
                await expect(last_answer(page)).to_contain_text(GREETING)
                (driver,) = gateway.runtime.drivers.values()
                assert driver.session.principal.name == "key:backend/user:demo-user"
            finally:
                SHOTS.mkdir(exist_ok=True)
                await page.screenshot(path=SHOTS / "test_with_auth_on_the_page.png")
                await browser.close()

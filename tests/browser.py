"""The web demo in a real headless Chromium (Debian's, driven by Playwright): the page helpers
the demo tests share. Every page leaves a full-page screenshot in test-output/ (git-ignored;
CI keeps it as an artifact).

A test module whose tests run on the session's event loop (``BROWSER_TESTS``) shares one
Chromium and one Playwright driver (``shared_browser``): each page gets a fresh browser
context (its own storage, cookies and permissions), which is what a fresh browser gave it,
without starting Chromium and the driver again (about half a second a test). A page with
Chromium flags of its own (a fake microphone) gets a browser of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import (
    Browser,
    Locator,
    Page,
    ViewportSize,
    WebSocketRoute,
    async_playwright,
    expect,
)

from tests.support import Gateway

__all__ = [
    "BROWSER_TESTS",
    "DESKTOP",
    "GREETING",
    "PHONE",
    "VIEWPORTS",
    "SocketGate",
    "answered",
    "base_url",
    "last_answer",
    "open_page",
    "send",
    "shared_browser",
]

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
DESKTOP = ViewportSize(width=1280, height=800)
PHONE = ViewportSize(width=390, height=844)
VIEWPORTS = {"desktop": DESKTOP, "phone": PHONE}
"""The two sizes every layout test runs at (pytest ids: desktop, phone)."""


_SHARED: dict[asyncio.AbstractEventLoop, Browser] = {}
"""The shared Chromium, by the event loop it runs on (the session's)."""

BROWSER_TESTS = [
    pytest.mark.slow,  # a real Chromium: seconds per test
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.usefixtures("shared_browser"),
]
"""A browser test module's ``pytestmark``: its tests and their async fixtures run on the
session's event loop (fixtures: ``@pytest_asyncio.fixture(loop_scope="session")``), where
they share one Chromium."""


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_browser() -> AsyncIterator[Browser]:
    """One Chromium for every browser test on the session's loop (``open_page`` finds it)."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        loop = asyncio.get_running_loop()
        _SHARED[loop] = browser
        try:
            yield browser
        finally:
            del _SHARED[loop]
            await browser.close()


class SocketGate:
    """Every WebSocket of a page goes through Playwright's WebSocket route, to the gateway. While
    ``down``, a new one is closed at once with 1013 ("try again"), as by a gateway that cannot
    take it yet: the SDK backs off and tries again. That is an outage the test switches off."""

    def __init__(self) -> None:
        self.down = False
        self.refused = 0
        self._changed = asyncio.Event()

    async def route(self, ws: WebSocketRoute) -> None:
        if self.down:
            self.refused += 1
            self._changed.set()
            await ws.close(code=1013, reason="the test's outage")
            return
        ws.connect_to_server()

    async def refusals(self, count: int) -> None:
        """Wait until ``count`` attempts were refused in all."""
        async with asyncio.timeout(20):
            while self.refused < count:
                self._changed.clear()
                await self._changed.wait()


def base_url(gateway: Gateway) -> str:
    """The gateway's HTTP root, where it serves the demo page."""
    return gateway.url.replace("ws://", "http://").removesuffix("/v1/realtime")


@asynccontextmanager
async def open_page(
    gateway: Gateway,
    shot: str,
    viewport: ViewportSize = DESKTOP,
    *,
    path: str = "/",
    wait_open: bool = True,
    gate: SocketGate | None = None,
    permissions: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> AsyncIterator[Page]:
    """The demo page in a fresh browser, connected (unless ``wait_open`` is false); saves
    ``test-output/<shot>.png`` when the test is done with it, passed or failed. With a
    ``gate``, its sockets go through it (an outage the test controls). ``flags`` go to
    Chromium after the usual ones (a fake microphone, say)."""
    async with AsyncExitStack() as stack:
        browser = _SHARED.get(asyncio.get_running_loop()) if not flags else None
        if browser is None:  # a browser of its own
            playwright = await stack.enter_async_context(async_playwright())
            browser = await playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=[*FLAGS, *flags]
            )
            stack.push_async_callback(browser.close)
        phone = viewport["width"] < 900
        context = await browser.new_context(
            viewport=viewport, is_mobile=phone, has_touch=phone, permissions=list(permissions)
        )
        stack.push_async_callback(context.close)
        page = await context.new_page()
        if gate is not None:
            await page.route_web_socket("**/v1/realtime**", gate.route)
        page.set_default_timeout(10_000)
        try:
            await page.goto(base_url(gateway) + path)
            if wait_open:
                await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
            yield page
        finally:
            SHOTS.mkdir(exist_ok=True)
            await page.screenshot(path=SHOTS / f"{shot}.png", full_page=True)


async def send(page: Page, text: str) -> None:
    """Type ``text`` in the composer and press Enter."""
    await page.locator("#composer").fill(text)
    await page.locator("#composer").press("Enter")


def last_answer(page: Page) -> Locator:
    """The newest assistant message."""
    return page.locator(".msg.assistant").last


async def answered(page: Page, text: str) -> Locator:
    """Send ``text`` and wait until the reply to it has ended; the reply."""
    before = await page.locator(".msg.assistant").count()
    await send(page, text)
    await expect(page.locator(".msg.assistant")).to_have_count(before + 1)
    answer = page.locator(".msg.assistant").nth(before)
    await expect(answer).to_have_attribute("data-state", "done")
    return answer

"""The screenshots of docs/web-demo.md, taken anew: the demo page in Debian's headless Chromium,
against a gateway on a free port, at 1280x800 and 390x844. Not a test (pytest does not collect
it); `make screenshots` runs it and writes docs/img/web-demo-*.png.

    .venv/bin/python -m tests.screenshots
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from playwright.async_api import Page, ViewportSize, expect

from gateway.logging import configure_logging
from tests.browser import DESKTOP, PHONE, SocketGate, answered, open_page, send
from tests.support import Gateway, serving

__all__: list[str] = []

OUT = Path(__file__).parents[1] / "docs" / "img"


async def _conversation(page: Page) -> None:
    """A conversation that shows most of what the page draws."""
    await answered(page, "what can you do?")
    await answered(page, "do you have headphones in stock?")
    await answered(page, "what's my battery level?")
    await send(page, "cancel my order 1234")
    card = page.locator("div.confirm").last
    await expect(card).to_have_attribute("data-status", "asking")
    await card.locator("button.confirm-approve").click()
    await expect(card).to_have_attribute("data-run", "completed")
    await expect(page.locator(".msg.assistant").last).to_have_attribute("data-state", "done")


async def _save(page: Page, name: str) -> None:
    await page.mouse.move(0, 0)  # no hover effect in the picture
    await page.screenshot(path=OUT / f"web-demo-{name}.png")
    print(f"docs/img/web-demo-{name}.png")


async def _chat(gateway: Gateway, viewport: ViewportSize, name: str) -> None:
    async with open_page(gateway, f"screenshot-{name}", viewport) as page:
        await _conversation(page)
        if viewport == DESKTOP:  # the inspector beside the chat: the events of all that
            await page.locator("#side-tab-inspector").click()
        await _save(page, name)


async def _markdown(gateway: Gateway, viewport: ViewportSize, name: str) -> None:
    """A reply in Markdown, in the dark theme."""
    async with open_page(gateway, f"screenshot-{name}", viewport) as page:
        await page.locator("#open-settings").click()
        await page.locator('input[name="theme"][value="dark"]').check()
        await page.locator("#settings-close").click()
        await answered(page, "what can you do?")
        await _save(page, name)


async def _outage(gateway: Gateway, viewport: ViewportSize, name: str) -> None:
    gate = SocketGate()
    async with open_page(gateway, f"screenshot-{name}", viewport, gate=gate) as page:
        await answered(page, "nearest store to 92031")
        gate.down = True
        driver = list(gateway.runtime.drivers.values())[-1]  # this page's: the newest
        assert driver.connection is not None
        driver.connection.close(1013, "an outage for the picture")
        await expect(page.locator("#banner")).to_have_attribute("data-state", "reconnecting")
        await gate.refusals(2)
        await send(page, "do you have headphones in stock?")
        await expect(page.locator(".msg.user").last).to_have_attribute("data-queued", "true")
        await _save(page, name)
        gate.down = False


async def main() -> None:
    configure_logging("warning")
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DEMO_ORDER_SECONDS", "3")
    async with serving(agent=None, scripted_pace=0) as gateway:
        await _chat(gateway, DESKTOP, "desktop")
        await _chat(gateway, PHONE, "phone")
        await _markdown(gateway, DESKTOP, "markdown-dark")
        await _outage(gateway, DESKTOP, "outage-desktop")
        await _outage(gateway, PHONE, "outage-phone")


if __name__ == "__main__":
    asyncio.run(main())

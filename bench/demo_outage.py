"""How long the web demo takes to come back after an outage, in Debian's headless Chromium.

The page's socket goes through Playwright's WebSocket route (tests/browser.py's SocketGate).
An outage: the gateway closes the page's socket (1013) and, for ``OUTAGE`` seconds, every new
socket is refused, so the browser SDK keeps trying with its backoff. Then the gate opens and the
clock runs until the page's banner says it is back (a `session.resumed` was drawn), polled every
animation frame. Three ways back:

- by itself: the SDK's next attempt after the gate opened (the backoff, up to the page's
  ``maxReconnectDelay`` of 2 s, with full jitter);
- Retry now: the banner's button is clicked as the gate opens;
- the browser back online: the outage is the browser's (``set_offline``), and the page's
  ``online`` handler retries at once.

Prints figures; asserts nothing.

    .venv/bin/python -m bench.demo_outage [trials]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from playwright.async_api import Page, expect

from gateway.logging import configure_logging
from tests.browser import SocketGate, answered, open_page
from tests.support import Gateway, serving

__all__: list[str] = []

OUTAGE = 3.0
BACK = "document.querySelector('#banner').dataset.state === 'back'"


async def _cut(gateway: Gateway) -> None:
    (driver,) = gateway.runtime.drivers.values()
    assert driver.connection is not None
    driver.connection.close(1013, "the outage starts")


async def _by_itself(page: Page, gateway: Gateway, gate: SocketGate, retry: bool) -> float:
    gate.down = True
    await _cut(gateway)
    await asyncio.sleep(OUTAGE)  # the outage: its length is the point here
    gate.down = False
    opened = time.monotonic()
    if retry:  # at once: a click through Playwright's checks would give the backoff time
        await page.evaluate("document.querySelector('[data-banner-action=retry]').click()")
    await page.wait_for_function(BACK, polling="raf", timeout=30_000)
    back = time.monotonic() - opened
    await expect(page.locator("#banner")).to_be_hidden()
    return back


async def _offline(page: Page) -> float:
    await page.context.set_offline(True)
    await expect(page.locator("#banner")).to_have_attribute("data-state", "offline")
    await asyncio.sleep(OUTAGE)
    await page.context.set_offline(False)
    opened = time.monotonic()
    await page.wait_for_function(BACK, polling="raf", timeout=30_000)
    back = time.monotonic() - opened
    await expect(page.locator("#banner")).to_be_hidden()
    return back


def _line(label: str, seconds: list[float]) -> str:
    return (
        f"{label:<34} n={len(seconds):<3} median={statistics.median(seconds):5.2f} s  "
        f"max={max(seconds):5.2f} s"
    )


async def main(trials: int) -> None:
    configure_logging("warning")
    gate = SocketGate()
    async with serving(agent=None, scripted_pace=0) as gateway:
        async with open_page(gateway, "bench_demo_outage", gate=gate) as page:
            await answered(page, "hello")  # the session exists: the pill says open before that
            alone = [await _by_itself(page, gateway, gate, retry=False) for _ in range(trials)]
            clicked = [await _by_itself(page, gateway, gate, retry=True) for _ in range(trials)]
            online = [await _offline(page) for _ in range(trials)]
    print(f"web demo: back after a {OUTAGE:.0f} s outage (from the end of the outage)")
    print(_line("by itself (backoff, max 2 s)", alone))
    print(_line("Retry now clicked", clicked))
    print(_line("browser back online", online))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))

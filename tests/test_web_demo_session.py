"""The web demo and its session, in a real headless Chromium: a reload resumes the session,
the page shows the agent it talks to (its suggestions, provider and model), and a model that
fails or is being retried says so in the reply. Screenshots go to test-output/."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import expect

from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelRetrying, ModelText
from gateway.errors import ProviderError
from gateway.providers.base import Capabilities
from tests import support
from tests.browser import BROWSER_TESTS, GREETING, answered, base_url, last_answer, open_page
from tests.support import Gateway, serving

DATA = Path(__file__).parent / "data"

pytestmark = BROWSER_TESTS  # a real Chromium, shared by the module's tests


@pytest_asyncio.fixture(loop_scope="session")
async def demo(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "1.5")
    async with serving(agent=None, scripted_pace=0.02) as gateway:
        yield gateway


# ---- Reload ------------------------------------------------------------------------------------


async def test_a_reload_keeps_the_conversation_and_its_session(demo: Gateway):
    async with open_page(demo, "test_a_reload_keeps_the_conversation_and_its_session") as page:
        await answered(page, "nearest store to 92031")
        (session_id,) = demo.runtime.drivers
        await page.reload()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
        await expect(page.locator("#banner")).to_contain_text("restored after the reload")
        await expect(page.locator(".msg.user")).to_have_text(["nearest store to 92031"])
        await expect(last_answer(page)).to_contain_text("The nearest store to 92031 is Vista")
        await expect(page.locator('.activity[data-tool="get_nearest_store"]')).to_have_count(1)
        await expect(page.locator("#connection")).to_have_attribute("data-reconnects", "0")
        assert list(demo.runtime.drivers) == [session_id]  # the same session, no new one
        answer = await answered(page, "hello")
        await expect(answer).to_contain_text(GREETING)
        assert list(demo.runtime.drivers) == [session_id]
        await page.locator("#open-settings").click()
        await expect(page.locator("#net-session")).to_have_text(session_id)


async def test_an_async_result_due_during_a_reload_arrives_after_it(
    demo: Gateway, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DEMO_ORDER_SECONDS", "4")  # read by each lookup
    async with open_page(demo, "test_an_async_result_due_during_a_reload") as page:
        await answered(page, "where is my order 1234?")
        chip = page.locator('.chip.async[data-tool="check_order_status"]')
        await expect(chip).to_have_attribute("data-status", re.compile("pending|progress"))
        await page.reload()  # the lookup takes 4 s: it ends after this page is back
        await expect(chip).to_have_attribute("data-status", "completed", timeout=15_000)
        await expect(chip).to_contain_text("on its way")
        await expect(page.locator(".msg.assistant.async-update")).to_have_count(1)
        assert len(demo.runtime.drivers) == 1


async def test_a_reload_after_the_session_ended_starts_a_new_one(demo: Gateway):
    async with open_page(demo, "test_a_reload_after_the_session_ended") as page:
        await answered(page, "hello")
        (driver,) = demo.runtime.drivers.values()
        driver.stop()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "closed")
        await expect(page.locator("#banner")).to_have_attribute("data-state", "closed")
        await expect(page.locator("#banner button", has_text="New chat")).to_be_visible()
        await page.reload()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "open")
        await expect(page.locator(".msg.user")).to_have_count(0)
        answer = await answered(page, "hello")
        await expect(answer).to_contain_text(GREETING)
        (new,) = demo.runtime.drivers
        assert new != driver.session_id


async def test_the_demo_hands_a_bill_to_the_billing_desk_and_a_reload_keeps_it(demo: Gateway):
    async with open_page(demo, "test_the_demo_hands_a_bill_to_the_billing_desk") as page:
        answer = await answered(page, "I have a question about my bill")
        await expect(answer).to_contain_text("Let me hand you over to our billing desk.")
        await expect(answer.locator('.msg-transfer[data-agent="billing"]')).to_contain_text(
            "Now with the billing agent (a billing question)"
        )
        await expect(answer).to_contain_text("Billing desk here")
        await expect(page.locator("#agent-name")).to_have_text("the billing agent")
        answer = await answered(page, "show my last invoice")  # the billing desk's own tool
        await expect(answer).to_contain_text("Your last invoice, INV-2041, was $39.00, paid")
        tool = page.locator('.tool[data-tool="get_last_invoice"]')  # its tools, in the panel
        await tool.locator("button.tool-run").click()
        await expect(tool.locator(".tool-output")).to_have_attribute("data-ok", "true")
        await expect(tool.locator(".tool-output")).to_contain_text("INV-2041")
        await expect(page.locator('.tool[data-tool="check_stock"]')).to_have_count(0)
        await page.reload()
        await expect(page.locator("#banner")).to_contain_text("restored after the reload")
        await expect(page.locator("#agent-name")).to_have_text("the billing agent")
        answer = await answered(page, "back to the shop please")
        await expect(answer.locator('.msg-transfer[data-agent="demo"]')).to_have_count(1)
        await expect(answer).to_contain_text("Shop assistant here again.")
        await expect(page.locator("#agent-name")).to_have_text("the demo agent")
        await expect(page.locator('.tool[data-tool="check_stock"]')).to_have_count(1)


# ---- The agent: suggestions, provider and model -----------------------------------------------


async def test_the_demo_agent_suggests_its_own_prompts(demo: Gateway):
    async with httpx.AsyncClient(base_url=base_url(demo), trust_env=False) as client:
        described = (await client.get("/v1/agent")).json()
    assert described["agent"] == "demo"
    assert (described["provider"], described["model"]) == ("scripted", None)
    async with open_page(demo, "test_the_demo_agent_suggests_its_own_prompts") as page:
        await expect(page.locator(".suggestion")).to_have_text(described["suggestions"])
        await expect(page.locator("#model-note")).to_contain_text("scripted")
        await page.locator(".suggestion", has_text="hello").click()
        await expect(last_answer(page)).to_contain_text(GREETING)


async def test_another_agent_brings_its_own_suggestions(tmp_path: Path):
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'name = "echoes"\nsuggestions = ["echo good morning"]\n'
        f'[model]\nprovider = "scripted"\nscenario = "{DATA / "scenario.toml"}"\n'
    )
    async with (
        serving(agent=str(agent), scripted_pace=0) as gateway,
        open_page(gateway, "test_another_agent_brings_its_own_suggestions") as page,
    ):
        await expect(page.locator(".suggestion")).to_have_text(["echo good morning"])
        await expect(page.locator("#agent-name")).to_have_text("the echoes agent")
        await page.locator(".suggestion").click()
        await expect(last_answer(page)).to_have_attribute("data-state", "done")
        await expect(last_answer(page)).to_contain_text("good morning")


async def test_an_http_model_is_named_and_no_demo_phrase_is_offered():
    async with serving(agent=str(DATA / "provider_agent.toml")) as gateway:
        async with httpx.AsyncClient(base_url=base_url(gateway), trust_env=False) as client:
            described = (await client.get("/v1/agent")).json()
        assert described == {
            "agent": "provider_test",
            "provider": "openai",
            "model": "mock-model",
            "suggestions": [],
        }
        async with open_page(gateway, "test_an_http_model_is_named") as page:
            await expect(page.locator("#model-note")).to_have_text("Model: openai · mock-model.")
            await expect(page.locator("#suggestions")).to_be_hidden()
            await expect(page.locator(".tool-try")).to_have_count(0)
            await expect(page.locator("#intro, .intro")).not_to_contain_text("scripted")


# ---- A model that fails, or is retried ---------------------------------------------------------


class RetriedModel:
    """A model whose first attempt fails: each step says it is retrying, then waits for the
    test (``release``) and answers, or fails for good when the step's outcome says so."""

    name = "retried"
    capabilities = Capabilities()

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.release: asyncio.Queue[None] = asyncio.Queue()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        outcome = self.outcomes.pop(0)
        yield ModelRetrying(attempt=1, delay=2.0, reason="HTTP 429")
        await self.release.get()
        if outcome == "fail":
            raise ProviderError("HTTP 503 from http://llm.test/v1/chat/completions: overloaded")
        yield ModelText("Back on my feet.")
        yield ModelFinish()

    async def aclose(self) -> None:
        pass


@pytest_asyncio.fixture(loop_scope="session")
async def retried(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Gateway, RetriedModel]]:
    model = RetriedModel(["answer", "fail"])
    demo_agent = support.agent_from_config
    monkeypatch.setattr(
        support,
        "agent_from_config",
        lambda config: dataclasses.replace(demo_agent(config), provider=model),
    )
    async with serving(agent=None) as gateway:
        yield gateway, model


async def test_a_retry_shows_as_a_status_line_then_the_answer(
    retried: tuple[Gateway, RetriedModel],
):
    gateway, model = retried
    async with open_page(gateway, "test_a_retry_shows_as_a_status_line") as page:
        await page.locator("#composer").fill("anything")
        await page.locator("#composer").press("Enter")
        status = last_answer(page).locator(".msg-retry")
        await expect(status).to_contain_text("HTTP 429")
        await expect(status).to_contain_text("trying again in 2 s")
        model.release.put_nowait(None)
        await expect(last_answer(page)).to_have_attribute("data-state", "done")
        await expect(last_answer(page)).to_contain_text("Back on my feet.")
        await expect(status).to_have_count(0)


async def test_a_failed_reply_shows_why(retried: tuple[Gateway, RetriedModel]):
    gateway, model = retried
    model.outcomes.reverse()  # this test's first step fails
    async with open_page(gateway, "test_a_failed_reply_shows_why") as page:
        await page.locator("#composer").fill("anything")
        await page.locator("#composer").press("Enter")
        await expect(last_answer(page).locator(".msg-retry")).to_be_visible()
        model.release.put_nowait(None)
        answer = last_answer(page)
        await expect(answer).to_have_attribute("data-state", "failed")
        await expect(answer.locator(".msg-error")).to_contain_text("HTTP 503 from http://llm.test")
        await expect(answer).to_contain_text("Failed")
        await expect(answer.locator(".msg-retry")).to_have_count(0)
        await expect(page.locator(".msg.system.error")).to_have_count(0)  # said once, in place

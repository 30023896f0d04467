"""``ModelRequest.tool_choice`` on the wire of each HTTP adapter, against llmock.

llmock is a real third-party server of the vendors' APIs that records every request body
and reads ``tool_choice`` / ``toolConfig`` as the vendor would: with its tool mode on, it
answers ``none`` in text, ``required`` with a call and a named tool with a call of that
tool. So each case checks both the body the adapter sent and that a server reading the
vendor's format understood it. ``auto`` (and a request without tools) sends no such field,
so those bodies are what they were before tool choice existed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelToolCall, ToolSchema
from gateway.core.transcript import UserTurn
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.gemini import GeminiProvider
from gateway.providers.http import HttpModel, HttpProvider
from gateway.providers.openai import OpenAIProvider
from tests.mock_llm import MockLLM, mock_llm

ADAPTERS: dict[str, type[HttpProvider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
}
FIELD = {"openai": "tool_choice", "anthropic": "tool_choice", "gemini": "toolConfig"}
"""Where each vendor takes the choice in its request body."""

OBJECT = {"type": "object", "properties": {}}
TOOLS = (
    ToolSchema(name="lamp_on", description="Switch the lamp on", input_schema=OBJECT),
    ToolSchema(name="weather", description="Read the weather outside", input_schema=OBJECT),
)
# The prompt matches lamp_on best, so a call of weather shows the named choice was obeyed.
PROMPT = "switch the lamp on"

EXPECTED: dict[str, dict[str, Any]] = {
    "openai": {
        "none": "none",
        "required": "required",
        "weather": {"type": "function", "function": {"name": "weather"}},
    },
    "anthropic": {
        "none": {"type": "none"},
        "required": {"type": "any"},
        "weather": {"type": "tool", "name": "weather"},
    },
    "gemini": {
        "none": {"functionCallingConfig": {"mode": "NONE"}},
        "required": {"functionCallingConfig": {"mode": "ANY"}},
        "weather": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}},
    },
}

KEYS_WITHOUT_CHOICE = {
    "openai": {"model", "messages", "stream", "stream_options", "tools"},
    "anthropic": {"model", "max_tokens", "messages", "stream", "system", "tools"},
    "gemini": {"contents", "systemInstruction", "tools"},
}
"""The top-level fields of a request with tools and ``auto``: nothing added."""


@pytest.fixture
async def llm() -> AsyncIterator[MockLLM]:
    async with mock_llm() as server:
        # The shared helper answers in text whatever the tools; here llmock should act on
        # the choice as a model would, so its tool mode goes back on.
        state = server.app.state
        state.mock_response_settings = dataclasses.replace(
            state.mock_response_settings, tool_mode="auto"
        ).validated()
        yield server


async def step(
    llm: MockLLM, provider: str, request: ModelRequest
) -> tuple[dict[str, Any], list[ModelEvent]]:
    """Stream one step to llmock: the request body it got and the model's events."""
    adapter = ADAPTERS[provider](
        HttpModel(model="mock-model", base_url=llm.base_url(provider), max_retries=0)
    )
    try:
        async with asyncio.timeout(10):
            events = [event async for event in adapter.stream(request)]
    finally:
        await adapter.aclose()
    (record,) = await llm.requests()
    assert record.status == 200
    return record.body, events


def calls(events: list[ModelEvent]) -> list[str]:
    return [event.name for event in events if isinstance(event, ModelToolCall)]


def request(tool_choice: str, tools: tuple[ToolSchema, ...] = TOOLS) -> ModelRequest:
    return ModelRequest(
        instructions="You control a house.",
        items=(UserTurn(text=PROMPT),),
        tools=tools,
        tool_choice=tool_choice,
    )


@pytest.mark.parametrize("provider", ADAPTERS)
async def test_none_reaches_the_model_and_it_answers_in_text(llm, provider):
    body, events = await step(llm, provider, request("none"))
    assert body[FIELD[provider]] == EXPECTED[provider]["none"]
    assert calls(events) == []
    assert isinstance(events[-1], ModelFinish)


@pytest.mark.parametrize("provider", ADAPTERS)
async def test_required_reaches_the_model_and_it_calls_a_tool(llm, provider):
    body, events = await step(llm, provider, request("required"))
    assert body[FIELD[provider]] == EXPECTED[provider]["required"]
    assert calls(events)
    assert set(calls(events)) <= {tool.name for tool in TOOLS}


@pytest.mark.parametrize("provider", ADAPTERS)
async def test_a_named_tool_reaches_the_model_and_it_calls_that_tool(llm, provider):
    body, events = await step(llm, provider, request("weather"))
    assert body[FIELD[provider]] == EXPECTED[provider]["weather"]
    assert calls(events) == ["weather"]  # not lamp_on, which the prompt matches best


@pytest.mark.parametrize("provider", ADAPTERS)
async def test_auto_sends_no_tool_choice(llm, provider):
    body, events = await step(llm, provider, request("auto"))
    assert FIELD[provider] not in body
    assert set(body) == KEYS_WITHOUT_CHOICE[provider]
    assert calls(events) == ["lamp_on"]  # the model chose, by the prompt


@pytest.mark.parametrize("provider", ADAPTERS)
@pytest.mark.parametrize("choice", ["none", "required", "weather"])
async def test_a_choice_without_tools_sends_neither_tools_nor_a_choice(llm, provider, choice):
    # Vendors refuse a tool choice without tools (OpenAI: 400), and there is nothing to
    # choose from.
    body, events = await step(llm, provider, request(choice, tools=()))
    assert FIELD[provider] not in body
    assert "tools" not in body
    assert calls(events) == []

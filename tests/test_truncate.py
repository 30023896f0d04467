"""response.truncate: when the user barges in on a spoken answer, the client says how much of
it was heard, and the history keeps only that, so the model does not believe it said what
was never heard. Checked in the session core, then on the wire of each provider (llmock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from client_sdk import connect
from gateway.core.event import RunTool, ToolFinished
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.transcript import AssistantTurn, ToolOutcome, UserTurn
from gateway.wire.v1 import (
    Error,
    ResponseCreated,
    ResponseDone,
    ResponseTruncate,
    ResponseTruncated,
    UserMessage,
)
from tests.mock_llm import MockLLM, mock_llm
from tests.redis_server import RedisServer
from tests.support import Gateway, serving
from tests.test_cluster import client_on, moved_to, said, text_of
from tests.test_session import Harness, persisted  # noqa: F401

# ----------------------------------------------------------------- the session core


def answered(h: Harness, *steps: list[Any]) -> str:
    """A user message answered in ``steps`` (each a list of model events); its id."""
    h.feed(UserMessage(text="weather?"))
    created = [m for m in h.sent if isinstance(m, ResponseCreated)][-1]
    for events in steps:
        h.model(*events, ModelFinish())
        for run in [e for e in h.other if isinstance(e, RunTool)]:
            h.feed(ToolFinished(call_id=run.call_id, output={"sky": "blue"}))
            h.other.remove(run)
    return created.response_id


def test_the_history_keeps_what_was_heard_across_steps_and_the_tool_calls_stay():
    h = Harness()
    h.start()
    response_id = answered(
        h,
        [ModelText("Let me look. "), ModelToolCall(name="weather", args={})],
        [ModelText("It is sunny and warm.")],
    )
    (truncated,) = h.feed(ResponseTruncate(id="t1", response_id=response_id, heard_chars=20))
    assert isinstance(truncated, ResponseTruncated)
    assert (truncated.response_id, truncated.heard_chars, truncated.in_reply_to) == (
        response_id,
        20,
        "t1",
    )
    h.feed(UserMessage(text="and tomorrow?"))
    items = h.last_model_call().request.items
    assert [type(i) for i in items] == [
        UserTurn,
        AssistantTurn,
        ToolOutcome,
        AssistantTurn,
        UserTurn,
    ]
    assert (items[1].text, items[3].text) == ("Let me look. ", "It is s")  # type: ignore[union-attr]
    assert items[1].calls[0].name == "weather"  # type: ignore[union-attr]


def test_truncating_a_running_response_stops_it_first():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="tell me a story"))
    h.feed(UserMessage(text="queued"))
    (created,) = [m for m in h.sent if isinstance(m, ResponseCreated)]
    h.model(ModelText("Once upon a time, "), ModelText("there was a lamp."))
    sent = h.feed(ResponseTruncate(response_id=created.response_id, heard_chars=9))
    done, truncated, started = [
        m for m in sent if isinstance(m, ResponseDone | ResponseTruncated | ResponseCreated)
    ]
    assert isinstance(done, ResponseDone) and done.status == "cancelled"  # noqa: PT018
    assert isinstance(truncated, ResponseTruncated)
    assert isinstance(started, ResponseCreated)  # the queued message, on the cut history
    items = h.last_model_call().request.items
    assert items[:2] == (UserTurn(text="tell me a story"), AssistantTurn(text="Once upon"))


def test_only_the_latest_response_can_be_truncated():
    h = Harness()
    h.start()
    first = answered(h, [ModelText("one")])
    answered(h, [ModelText("two")])
    (error,) = h.feed(ResponseTruncate(id="t1", response_id=first, heard_chars=1))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to) == ("invalid_message", "t1")
    assert "not the latest" in error.message


def test_truncating_past_the_end_changes_nothing():
    h = Harness()
    h.start()
    response_id = answered(h, [ModelText("short")])
    h.feed(ResponseTruncate(response_id=response_id, heard_chars=999))
    h.feed(UserMessage(text="next"))
    assert h.last_model_call().request.items[1] == AssistantTurn(text="short")


# ----------------------------------------------------------------- on the wire (llmock)

AGENT = Path(__file__).parent / "data" / "provider_agent.toml"
ANSWER = "The weather is sunny and warm today."


@pytest.fixture(params=["openai", "anthropic", "gemini"])
async def stack(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, MockLLM, Gateway]]:
    async with (
        mock_llm() as llm,
        serving(
            agent=str(AGENT),
            model=f"{request.param}:mock-model",
            base_url=llm.base_url(request.param),
        ) as gateway,
    ):
        yield request.param, llm, gateway


def assistant_texts(body: dict[str, Any], provider: str) -> list[str]:
    """What the model said before, as a request body carries it."""
    if provider == "openai":
        return [m["content"] for m in body["messages"] if m["role"] == "assistant"]
    if provider == "anthropic":
        return [
            m["content"]
            if isinstance(m["content"], str)
            else "".join(b.get("text", "") for b in m["content"])
            for m in body["messages"]
            if m["role"] == "assistant"
        ]
    return [
        "".join(part.get("text", "") for part in content["parts"])
        for content in body["contents"]
        if content["role"] == "model"
    ]


async def test_the_next_request_carries_only_what_was_heard(stack):
    provider, llm, gateway = stack
    await llm.script({"type": "reply", "text": ANSWER}, {"type": "reply", "text": "Rain."})
    async with connect(gateway.url) as conv:
        events = conv.events()
        assert "".join([d async for d in conv.say("weather?")]) == ANSWER
        msg_id = await conv.truncate(14)  # "The weather is": the user spoke over the rest
        async with asyncio.timeout(10):
            async for event in events:
                if isinstance(event, ResponseTruncated):
                    break
        assert (event.in_reply_to, event.heard_chars) == (msg_id, 14)
        assert "".join([d async for d in conv.say("and tomorrow?")]) == "Rain."
    _, second = await llm.requests()
    assert assistant_texts(second.body, provider) == ["The weather is"]


# ----------------------------------------------------------------- kept by the store


async def test_a_truncated_history_is_what_another_node_restores(redis: RedisServer):
    async with (
        serving(store=redis.url, node_id="node-a", lease_ttl=1.0) as a,
        serving(store=redis.url, node_id="node-b", lease_ttl=1.0) as b,
        client_on(a) as client,
    ):
        assert text_of(await said(client, "echo one two three four")) == "one two three four"
        await client.conv.truncate(7)  # "one two"
        await client.until_a(ResponseTruncated)
        await moved_to(client, b)
        assert client.conv.session is not None
        restored = b.runtime.drivers[client.conv.session.session_id].session.state().history
    assert restored == [UserTurn(text="echo one two three four"), AssistantTurn(text="one two")]

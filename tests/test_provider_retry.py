"""When the HTTP adapters retry, what the client hears meanwhile, and what a failure says.

Through a real gateway and the client SDK, against llmock where it can produce the case and
a hand-written server (``tests/raw_llm.py``) where it cannot: a retry happens whenever nothing
of the step reached the client (the opening events of a stream do not count), each one is
announced with ``response.retrying``, a silent server fails within its ``first_byte_timeout``,
a long ``Retry-After`` fails at once, and every error names the URL and the cause.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.wire.v1 import (
    Error,
    Outbound,
    ResponseDone,
    ResponseRetrying,
    TextDelta,
    ToolCalls,
    UserMessage,
)
from tests.mock_llm import mock_llm, now
from tests.raw_llm import HANG, Answer, raw_llm, sse
from tests.support import Gateway, say, serving, session, streamed_text
from tests.test_providers import AGENT, PROVIDERS

OPENING = {"openai": 1, "anthropic": 3}
"""llmock's events before any text: OpenAI's role chunk; Anthropic's message_start,
content_block_start and ping."""
ENDPOINTS = {
    "openai": "/chat/completions",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/mock-model:streamGenerateContent",
}
"""Where each adapter posts, below the ``base_url`` it gets."""


def agent_with(tmp_path: Path, **model: Any) -> Path:
    """The provider test agent with these ``[model]`` settings replaced or added."""
    text = AGENT.read_text()
    for key in model:
        text = re.sub(rf"^{key} = .*\n", "", text, flags=re.MULTILINE)
    lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in model.items())
    path = tmp_path / "agent.toml"
    path.write_text(text.replace("[model]\n", "[model]\n" + lines))
    return path


@asynccontextmanager
async def gateway_on(provider: str, base_url: str, agent: Path = AGENT) -> AsyncIterator[Gateway]:
    async with serving(agent=str(agent), model=f"{provider}:mock-model", base_url=base_url) as gw:
        yield gw


def raw_base(url: str, provider: str) -> str:
    """The base URL an adapter gets for the raw server (OpenAI's includes ``/v1``)."""
    return url + "/v1" if provider == "openai" else url


def notices(events: list[Outbound]) -> list[ResponseRetrying]:
    return [e for e in events if isinstance(e, ResponseRetrying)]


def failure(events: list[Outbound]) -> tuple[Error, ResponseDone]:
    error = next(e for e in events if isinstance(e, Error))
    done = events[-1]
    assert isinstance(done, ResponseDone)
    return error, done


@pytest.mark.parametrize("kind", ["disconnect", "stall"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_stream_cut_after_its_opening_events_is_retried(provider, kind):
    async with mock_llm() as llm, gateway_on(provider, llm.base_url(provider)) as gateway:
        await llm.script(
            {"type": "reply", "text": "made it", "times": 2},
            {
                "type": "stream_fault",
                "kind": kind,
                "after_chunks": OPENING[provider],
                "stall_seconds": 3,
            },
        )
        async with session(gateway.url) as (conn, _):
            events = await say(conn, "hi")
        assert len(await llm.requests()) == 2
    assert streamed_text(events) == "made it"
    (notice,) = notices(events)
    assert notice.attempt == 1
    assert notice.reason
    first_text = next(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    assert events.index(notice) < first_text


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_tool_call_cut_before_its_arguments_are_whole_is_retried(provider):
    async with mock_llm() as llm, gateway_on(provider, llm.base_url(provider)) as gateway:
        call = {"name": "device_b", "arguments": {"n": 123456789, "label": "long enough"}}
        await llm.script(
            {"type": "reply", "tool_calls": [call], "times": 2},
            {"type": "stream_fault", "kind": "disconnect", "after_chunks": 3},
        )
        async with session(gateway.url) as (conn, _):
            await conn.send(UserMessage(text="call b"))
            events = await conn.recv_until(lambda e: isinstance(e, ToolCalls))
    assert len(notices(events)) == 1
    calls = events[-1]
    assert isinstance(calls, ToolCalls)
    (made,) = calls.calls
    assert (made.tool, made.args) == ("device_b", call["arguments"])


async def test_a_gemini_stream_stalled_after_an_empty_first_chunk_is_retried():
    empty = sse({"candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}}]})
    whole = sse(
        {
            "candidates": [
                {
                    "content": {"parts": [{"text": "made it"}], "role": "model"},
                    "finishReason": "STOP",
                }
            ]
        }
    )
    async with (
        raw_llm(Answer(pieces=(empty, HANG)), Answer(pieces=(whole,))) as llm,
        gateway_on("gemini", llm.url) as gateway,
        session(gateway.url) as (conn, _),
    ):
        events = await say(conn, "hi")
    assert streamed_text(events) == "made it"
    assert [n.attempt for n in notices(events)] == [1]
    assert len(llm.seen) == 2


@pytest.mark.parametrize("answer", [Answer(headers=False), Answer(pieces=(HANG,))])
async def test_a_model_that_never_answers_fails_clearly_with_retry_notices(tmp_path, answer):
    agent = agent_with(tmp_path, first_byte_timeout=0.5)
    async with (
        raw_llm(answer) as llm,
        gateway_on("openai", llm.url + "/v1", agent) as gateway,
        session(gateway.url) as (conn, _),
    ):
        started = now()
        events = await say(conn, "hi")
        elapsed = now() - started
    error, done = failure(events)
    url = llm.url + "/v1/chat/completions"
    assert error.message == (f"the model failed: {url} did not answer within 0.5 s (3 attempts)"), (
        error.message
    )
    assert error.retryable
    assert done.status == "failed"
    assert [(n.attempt, n.reason) for n in notices(events)] == [
        (1, "no answer in 0.5 s"),
        (2, "no answer in 0.5 s"),
    ]
    assert len(llm.seen) == 3
    assert elapsed < 3 * 0.5 + 1.5 + 1.5  # three waits, the backoff (at most 0.5 + 1 s), slack


async def test_a_first_byte_slower_than_the_stall_timeout_is_waited_for():
    # stall_timeout is 0.5 s in the test agent, first_byte_timeout 5 s: the first byte
    # may take longer than a pause between bytes.
    async with mock_llm() as llm, gateway_on("openai", llm.base_url("openai")) as gateway:
        await llm.script(
            {"type": "reply", "text": "worth the wait"},
            {"type": "slow_first_token", "seconds": 1.0},
        )
        async with session(gateway.url) as (conn, _):
            events = await say(conn, "hi")
        assert len(await llm.requests()) == 1
    assert streamed_text(events) == "worth the wait"
    assert notices(events) == []


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_retry_after_longer_than_the_cap_fails_at_once(provider):
    async with mock_llm() as llm, gateway_on(provider, llm.base_url(provider)) as gateway:
        await llm.script(
            {"type": "fail", "status": 429, "retry_after": 3600, "message": "slow down"}
        )
        async with session(gateway.url) as (conn, _):
            started = now()
            events = await say(conn, "hi")
            elapsed = now() - started
        assert len(await llm.requests()) == 1
    error, done = failure(events)
    assert elapsed < 5
    assert error.retryable
    assert done.status == "failed"
    assert "HTTP 429 from " in error.message
    assert "3600 s" in error.message
    assert "max_retry_after (30 s)" in error.message
    assert error.message.endswith(": slow down")
    assert notices(events) == []


async def test_max_retry_after_is_a_model_setting(tmp_path):
    agent = agent_with(tmp_path, max_retry_after=0.2)
    async with mock_llm() as llm, gateway_on("openai", llm.base_url("openai"), agent) as gateway:
        await llm.script({"type": "fail", "status": 503, "retry_after": 0.5})
        async with session(gateway.url) as (conn, _):
            events = await say(conn, "hi")
    error, _ = failure(events)
    assert "0.5 s" in error.message
    assert "max_retry_after (0.2 s)" in error.message


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_200_answer_that_is_not_an_event_stream_says_so(provider):
    body = json.dumps({"error": {"message": "model not loaded"}}).encode()
    async with (
        raw_llm(Answer(pieces=(body,), content_type="application/json")) as llm,
        gateway_on(provider, raw_base(llm.url, provider)) as gateway,
        session(gateway.url) as (conn, _),
    ):
        events = await say(conn, "hi")
    error, done = failure(events)
    url = raw_base(llm.url, provider) + ENDPOINTS[provider]
    assert error.message == (
        f"the model failed: {url} answered HTTP 200 with application/json, "
        "not an event stream: model not loaded"
    ), error.message
    assert not error.retryable
    assert done.status == "failed"
    assert len(llm.seen) == 1


async def test_a_refused_connection_names_the_url_and_the_attempts():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    async with gateway_on("openai", base) as gateway, session(gateway.url) as (conn, _):
        events = await say(conn, "hi")
    error, done = failure(events)
    assert error.message == (
        f"the model failed: cannot reach {base}/chat/completions: connection refused (3 attempts)"
    )
    assert error.retryable
    assert done.status == "failed"
    assert [n.reason for n in notices(events)] == ["connection refused"] * 2


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_http_error_names_the_url_and_the_vendor_message(provider):
    async with mock_llm() as llm, gateway_on(provider, llm.base_url(provider)) as gateway:
        await llm.script({"type": "fail", "status": 401, "message": "invalid key, sorry"})
        async with session(gateway.url) as (conn, _):
            events = await say(conn, "hi")
    error, _ = failure(events)
    url = llm.base_url(provider) + ENDPOINTS[provider]
    assert error.message == f"the model failed: HTTP 401 from {url}: invalid key, sorry"
    assert not error.retryable
    assert notices(events) == []


async def test_an_error_never_shows_the_api_key(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVIDER_TEST_KEY", "sk-secret-1234567890")
    agent = agent_with(tmp_path, api_key_env="PROVIDER_TEST_KEY")
    echo = {"error": {"message": "Incorrect API key provided: sk-secret-1234567890."}}
    answer = Answer(
        pieces=(json.dumps(echo).encode(),), status=401, content_type="application/json"
    )
    async with (
        raw_llm(answer) as llm,
        gateway_on("openai", llm.url + "/v1", agent) as gateway,
        session(gateway.url) as (conn, _),
    ):
        events = await say(conn, "hi")
    assert llm.seen[0].headers["authorization"] == "Bearer sk-secret-1234567890"
    error, _ = failure(events)
    assert "sk-secret" not in error.message
    assert error.message.endswith("Incorrect API key provided: ***.")

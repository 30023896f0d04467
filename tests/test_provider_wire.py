"""What the HTTP adapters put on the wire and take from it, through a real gateway.

One pooled connection for every step of a turn; the conversation mapped without an empty
assistant message (OpenAI) or two user messages run together (Anthropic, Gemini); an emoji
or tool arguments cut between the two UTF-16 halves of a character, as a JavaScript server
cuts them, reaching the client whole; a missing API key said at startup.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import structlog
import uvloop

from gateway.agent.file import load_agent
from gateway.core.model import ModelRequest, ModelText
from gateway.core.transcript import AssistantTurn, ContextNote, UserTurn
from gateway.providers import ModelSettings, create_provider
from gateway.providers.anthropic import anthropic_messages
from gateway.providers.gemini import gemini_contents
from gateway.providers.http import HttpModel
from gateway.providers.openai import OpenAIProvider, openai_messages
from gateway.wire.v1 import ResponseDone, ToolCalls, ToolResult, ToolResults, UserMessage
from tests.mock_llm import asgi_server, mock_llm
from tests.raw_llm import Answer, raw_llm, sse
from tests.support import say, serving, session, streamed_text
from tests.test_providers import AGENT, PROVIDERS


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_steps_of_a_turn_share_one_connection(provider):
    async with mock_llm() as llm:
        base = llm.base_url(provider)
        async with serving(agent=str(AGENT), model=f"{provider}:m", base_url=base) as gateway:
            await llm.script(
                {"type": "reply", "tool_calls": [{"name": "device_a", "arguments": {}}]},
                {"type": "reply", "tool_calls": [{"name": "device_b", "arguments": {"n": 1}}]},
                {"type": "reply", "text": "all done"},
            )
            async with session(gateway.url) as (conn, _):
                await conn.send(UserMessage(text="go"))
                for _ in range(2):
                    calls = (await conn.recv_until(lambda e: isinstance(e, ToolCalls)))[-1]
                    assert isinstance(calls, ToolCalls)
                    results = [
                        ToolResult(call_id=c.call_id, tool=c.tool, output={"value": "x"})
                        for c in calls.calls
                    ]
                    await conn.send(ToolResults(results=results))
                events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
            assert len(await llm.requests()) == 3
    assert streamed_text(events) == "all done"
    assert len(llm.client_ports) == 3
    assert len(set(llm.client_ports)) == 1, llm.client_ports


async def test_a_client_made_for_another_running_loop_is_closed():
    provider = OpenAIProvider(HttpModel(model="m", base_url="http://127.0.0.1:9/v1"))
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:

        async def client_there() -> Any:
            return provider._client()

        old = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client_there(), other))
        here = provider._client()
        async with asyncio.timeout(5):
            # Closed by its own loop, in the other thread: nothing here to wait on but that.
            while not old.is_closed:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert not here.is_closed
        await provider.aclose()
        assert here.is_closed
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
        other.close()


async def test_a_step_that_said_nothing_is_left_out_of_the_openai_history():
    async with mock_llm() as llm:
        base = llm.base_url("openai")
        async with serving(agent=str(AGENT), model="openai:m", base_url=base) as gateway:
            await llm.script({"type": "reply", "text": ""}, {"type": "reply", "text": "hello"})
            async with session(gateway.url) as (conn, _):
                first = await say(conn, "hi")
                second = await say(conn, "again")
            _, record = await llm.requests()
    assert streamed_text(first) == ""
    assert streamed_text(second) == "hello"
    messages = record.body["messages"]
    assert [(m["role"], m.get("content")) for m in messages] == [
        ("system", "You are the provider test agent."),
        ("user", "hi"),
        ("user", "again"),
    ]


def user_blocks(body: dict[str, Any], provider: str) -> list[list[str]]:
    """The texts of each user message of a request, block by block."""
    if provider == "anthropic":
        return [
            [block["text"] for block in m["content"]]
            for m in body["messages"]
            if m["role"] == "user"
        ]
    return [[part["text"] for part in c["parts"]] for c in body["contents"] if c["role"] == "user"]


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
async def test_two_user_turns_in_a_row_stay_two_blocks(provider):
    async with mock_llm() as llm:
        base = llm.base_url(provider)
        async with serving(agent=str(AGENT), model=f"{provider}:m", base_url=base) as gateway:
            await llm.script({"type": "reply", "text": ""}, {"type": "reply", "text": "hello"})
            async with session(gateway.url) as (conn, _):
                await say(conn, "hi")
                await say(conn, "again")
            _, record = await llm.requests()
    assert user_blocks(record.body, provider) == [["hi", "again"]]


def test_a_context_note_and_a_user_turn_stay_two_blocks():
    request = ModelRequest(
        instructions="",
        items=(
            UserTurn(text="hi"),
            AssistantTurn(text="hello"),
            ContextNote(text="<context>function [lamp] completed with response {}</context>"),
            UserTurn(text="and now?"),
            AssistantTurn(),
            UserTurn(text=""),
        ),
    )
    note = "<context>function [lamp] completed with response {}</context>"
    assert anthropic_messages(request)[-1] == {
        "role": "user",
        "content": [{"type": "text", "text": note}, {"type": "text", "text": "and now?"}],
    }
    assert gemini_contents(request)[-1] == {
        "role": "user",
        "parts": [{"text": note}, {"text": "and now?"}],
    }
    roles = [m["role"] for m in openai_messages(request)]
    assert roles == ["user", "assistant", "user", "user", "user"]  # the empty step left out


# What a JavaScript server sends: "Hello 😀 world" cut between the halves of the emoji,
# and tool arguments cut the same way, each half a "\udXXX" escape of its own.
HIGH, LOW = "\ud83d", "\ude00"


def openai_answers() -> list[Answer]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    def call(arguments: str, first: bool = False) -> dict[str, Any]:
        fragment: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
        if first:  # the first fragment names the call
            fragment |= {"id": "call_1", "type": "function"}
            fragment["function"]["name"] = "device_b"
        return {"tool_calls": [fragment]}

    done = sse("[DONE]")
    text = (chunk({"content": f"Hello {HIGH}"}), chunk({"content": f"{LOW} world"}))
    return [
        Answer(
            pieces=(chunk({"role": "assistant", "content": ""}), *text, chunk({}, "stop"), done)
        ),
        Answer(
            pieces=(
                chunk(call('{"text": "' + HIGH, first=True)),
                chunk(call(LOW + '"}')),
                chunk({}, "tool_calls"),
                done,
            )
        ),
        Answer(pieces=(chunk({"content": "noted"}), chunk({}, "stop"), done)),
    ]


def anthropic_answers() -> list[Answer]:
    def event(data: dict[str, Any]) -> bytes:
        return sse(data, event=data["type"])

    def block(index: int, start: dict[str, Any], deltas: list[dict[str, Any]]) -> list[bytes]:
        return [
            event({"type": "content_block_start", "index": index, "content_block": start}),
            *(event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas),
            event({"type": "content_block_stop", "index": index}),
        ]

    def message(blocks: list[bytes], stop: str) -> Answer:
        start = event({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})
        end = event({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {}})
        return Answer(pieces=(start, *blocks, end, event({"type": "message_stop"})))

    def text(*pieces: str) -> list[bytes]:
        return block(
            0, {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in pieces]
        )

    use = {"type": "tool_use", "id": "toolu_1", "name": "device_b", "input": {}}
    arguments = [
        {"type": "input_json_delta", "partial_json": p} for p in ('{"text": "' + HIGH, LOW + '"}')
    ]
    return [
        message(text(f"Hello {HIGH}", f"{LOW} world"), "end_turn"),
        message(block(0, use, arguments), "tool_use"),
        message(text("noted"), "end_turn"),
    ]


def gemini_answers() -> list[Answer]:
    def chunk(parts: list[dict[str, Any]], finish: str | None = None) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
        if finish:
            candidate["finishReason"] = finish
        return sse({"candidates": [candidate]})

    # Gemini sends a call whole: its arguments carry the two halves as two escapes.
    call = {"functionCall": {"name": "device_b", "args": {"text": HIGH + LOW}}}
    return [
        Answer(
            pieces=(chunk([{"text": f"Hello {HIGH}"}]), chunk([{"text": f"{LOW} world"}], "STOP"))
        ),
        Answer(pieces=(chunk([call], "STOP"),)),
        Answer(pieces=(chunk([{"text": "noted"}], "STOP"),)),
    ]


ANSWERS = {"openai": openai_answers, "anthropic": anthropic_answers, "gemini": gemini_answers}


async def emoji_turns(provider: str, base_url: str, text: str, args: dict[str, Any]) -> None:
    """Through a gateway on the model at ``base_url``: "hi" gets ``text``, "note it" a call
    of device_b with ``args``, and its result the text "noted" (the session goes on)."""
    async with (
        serving(agent=str(AGENT), model=f"{provider}:m", base_url=base_url) as gateway,
        session(gateway.url) as (conn, _),
    ):
        events = await say(conn, "hi")
        assert streamed_text(events) == text
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.status == "completed"
        await conn.send(UserMessage(text="note it"))
        calls = (await conn.recv_until(lambda e: isinstance(e, ToolCalls)))[-1]
        assert isinstance(calls, ToolCalls)
        (call,) = calls.calls
        assert (call.tool, call.args) == ("device_b", args)
        result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "ok"})
        await conn.send(ToolResults(results=[result]))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert streamed_text(events) == "noted"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_halves_of_an_emoji_cut_by_the_server_reach_the_client_whole(provider):
    async with raw_llm(*ANSWERS[provider]()) as llm:
        base = llm.url + "/v1" if provider == "openai" else llm.url
        await emoji_turns(provider, base, "Hello 😀 world", {"text": "😀"})
    assert len(llm.seen) == 3


def test_a_missing_api_key_is_a_startup_warning(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with structlog.testing.capture_logs() as logs:
        load_agent(AGENT, model="openai:m", base_url="http://user:pw@127.0.0.1:9/v1?k=v")
    (warning,) = [line for line in logs if line["event"] == "model_api_key_missing"]
    assert warning["log_level"] == "warning"
    assert (warning["provider"], warning["variable"]) == ("openai", "OPENAI_API_KEY")
    assert warning["base_url"] == "http://127.0.0.1:9/v1"  # no credentials, no query

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with structlog.testing.capture_logs() as logs:
        load_agent(AGENT, model="openai:m", base_url="http://127.0.0.1:9/v1")
    assert [line for line in logs if line["event"] == "model_api_key_missing"] == []


async def test_more_steps_stream_at_once_than_httpx_pools_by_default():
    # httpx's default pool holds 100 connections: the 101st conversation streaming at once
    # would wait for one. This server answers no request until all of them are in.
    streams = 120
    arrived = 0
    everyone_in = asyncio.Event()

    async def gate(scope: Any, receive: Any, send: Any) -> None:
        nonlocal arrived
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        arrived += 1
        if arrived == streams:
            everyone_in.set()
        await everyone_in.wait()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        body = sse(chunk) + sse("[DONE]")
        await send({"type": "http.response.body", "body": body})

    async with asgi_server(gate) as url:
        settings = HttpModel(model="m", base_url=url + "/v1", connect_timeout=2.0, max_retries=0)
        provider = OpenAIProvider(settings)
        request = ModelRequest(instructions="", items=(UserTurn(text="hi"),))

        async def one() -> str:
            return "".join(
                [e.text async for e in provider.stream(request) if isinstance(e, ModelText)]
            )

        try:
            async with asyncio.timeout(30):
                texts = await asyncio.gather(
                    *(one() for _ in range(streams)), return_exceptions=True
                )
        finally:
            everyone_in.set()  # a failed run must not leave the server's handlers waiting
            await provider.aclose()
    assert texts == ["hi"] * streams


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_providers_stream_on_uvloop_as_the_gateway_runs_them(provider):
    # The gateway serves on uvloop, whose transports are not asyncio's classes: the HTTP
    # client must not care. Two answers, one kept-alive connection.
    async def two_answers() -> tuple[list[str], list[int]]:
        async with mock_llm() as llm:
            await llm.script(
                {"type": "reply", "text": "one two"}, {"type": "reply", "text": "three"}
            )
            settings = ModelSettings(provider=provider, model="m", base_url=llm.base_url(provider))
            model = create_provider(settings, base_dir=AGENT.parent)
            request = ModelRequest(instructions="", items=(UserTurn(text="hi"),))
            try:
                texts = [
                    "".join(
                        [e.text async for e in model.stream(request) if isinstance(e, ModelText)]
                    )
                    for _ in range(2)
                ]
            finally:
                await model.aclose()
            return texts, llm.client_ports

    texts, ports = uvloop.run(two_answers())
    assert texts == ["one two", "three"]
    assert len(ports) == 2
    assert len(set(ports)) == 1, ports


async def test_a_burst_the_session_reads_slower_than_it_comes_leaves_a_usable_connection():
    # 500 chunks in one write: the session's backlog fills, the client stops reading the
    # socket until the session has room. The connection must go back to the pool reading
    # again, or the next turn's answer on it is never read.
    words = [f"w{i} " for i in range(500)]
    chunks = [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in words]
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    burst = b"".join(sse(chunk) for chunk in [*chunks, last]) + sse("[DONE]")
    async with raw_llm(Answer(pieces=(burst,))) as llm:
        async with (
            serving(agent=str(AGENT), model="openai:m", base_url=llm.url + "/v1") as gateway,
            session(gateway.url) as (conn, _),
        ):
            for _ in range(3):
                await conn.send(UserMessage(text="go"))
                events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
                assert streamed_text(events) == "".join(words)
                assert events[-1].status == "completed"
    assert len(llm.seen) == 3
    assert len(llm.ports()) == 1

"""``/v1/openai/realtime``: OpenAI's own SDKs, pointed at a real gateway, keep their code.

The official ``openai`` package's realtime client drives the test agent's scripted model
(``tests/data/scenario.toml``) through the OpenAI Realtime protocol (GA names, text and
function calls), and so does the Agents SDK's ``RealtimeRunner``. A few pure tests pin
the codec's own decisions (``gateway.wire.openai.codec``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import websockets
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from gateway.core.transcript import AssistantTurn
from gateway.wire.codec import V1Codec
from gateway.wire.openai.codec import CHARS_PER_SECOND, OpenAIRealtimeCodec
from gateway.wire.v1 import (
    ClientCall,
    Pong,
    ResponseCreated,
    ResponseDone,
    ResponseTruncate,
    SessionCreated,
    SessionUpdated,
    TextDelta,
    TextDone,
    TextSegment,
    ToolCalls,
    ToolResults,
    UserMessage,
    encode,
)
from gateway.wire.v1 import SessionUpdate as CoreSessionUpdate
from tests.data.tools import gate, reset_gates
from tests.support import Gateway, serving

KEY = "0123456789abcdef0123"
"""An API key of the gateway: OpenAI's SDKs always send one (``Authorization: Bearer``)."""


@asynccontextmanager
async def openai_gateway(**overrides: Any) -> AsyncIterator[tuple[Gateway, AsyncOpenAI]]:
    """The test agent served with an API key, and an ``AsyncOpenAI`` client pointed at it."""
    overrides.setdefault("scripted_pace", 0.0)
    async with serving(no_auth=False, api_keys=f"app:{KEY}", **overrides) as gateway:
        base = f"ws://127.0.0.1:{gateway.port}/v1/openai"  # the SDK appends /realtime
        yield gateway, AsyncOpenAI(api_key=KEY, websocket_base_url=base)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[Gateway, AsyncOpenAI]]:
    reset_gates()
    async with openai_gateway() as served:
        yield served


async def receive_until(conn: AsyncRealtimeConnection, kind: str) -> list[Any]:
    """Events up to and including the next one of type ``kind``."""
    events: list[Any] = []
    async with asyncio.timeout(10):
        while True:
            events.append(await conn.recv())
            if events[-1].type == kind:
                return events


async def ask(conn: AsyncRealtimeConnection, text: str) -> list[Any]:
    """A user message item and ``response.create``; the events up to ``response.done``."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
    await conn.response.create()
    return await receive_until(conn, "response.done")


def of_type(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in of_type(events, "response.output_text.delta"))


# ----------------------------------------------------------------- the official SDK


async def test_a_text_turn_streams_the_answer_and_ends_completed_with_usage(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        assert created.session.model == "gpt-realtime"
        assert created.session.output_modalities == ["text"]
        events = await ask(conn, "echo hello there world")
    kinds = [e.type for e in events]
    assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]  # the echo
    assert events[0].item.role == "user"
    assert events[0].item.content[0].text == "echo hello there world"
    assert kinds[2:6] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert text_of(events) == "hello there world"
    (text_done,) = of_type(events, "response.output_text.done")
    assert text_done.text == "hello there world"
    done = events[-1].response
    assert (done.status, done.id) == ("completed", events[2].response.id)
    assert done.output[0].content[0].text == "hello there world"
    assert done.usage is not None
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert done.usage.output_tokens > 0


async def test_a_client_function_declared_in_session_update_is_called_and_answered(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        tool = {
            "type": "function",
            "name": "device_a",
            "description": "Client function A.",
            "parameters": {"type": "object", "properties": {}},
        }
        await conn.session.update(
            session={"type": "realtime", "output_modalities": ["text"], "tools": [tool]},
            event_id="u1",
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        assert [t.name for t in updated.session.tools] == ["device_a"]
        first = await ask(conn, "one")
        (call,) = of_type(first, "response.function_call_arguments.done")
        assert (call.name, call.arguments) == ("device_a", "{}")
        done = first[-1].response
        assert done.status == "completed"
        assert [item.type for item in done.output] == ["message", "function_call"]
        assert done.output[1].call_id == call.call_id
        output = {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": '{"value": "yes"}',
        }
        await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
        await conn.response.create(event_id="go-on")
        after = await receive_until(conn, "response.done")
    echoed = of_type(after, "conversation.item.added")[0].item
    assert (echoed.type, echoed.call_id) == ("function_call_output", call.call_id)
    (created,) = of_type(after, "response.created")
    assert created.response.id != done.id  # a new OpenAI response, the same core response
    assert text_of(after) == "A=yes"
    assert after[-1].response.status == "completed"
    assert not of_type(after, "error")


async def test_server_tools_and_async_tools_show_as_items_the_client_need_not_run(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        events = await ask(conn, "add 2 3")
        call, output = (e.item for e in of_type(events, "conversation.item.added")[1:3])
        assert (call.type, call.name, json.loads(call.arguments)) == (
            "function_call",
            "add",
            {"a": 2, "b": 3},
        )
        assert (output.type, output.call_id) == ("function_call_output", call.call_id)
        assert json.loads(output.output) == {"total": 5}
        assert text_of(events) == "sum=5"
        # Never a response's output: an SDK would run it.
        assert not of_type(events, "response.function_call_arguments.done")
        assert [item.type for item in events[-1].response.output] == ["message"]

        pending = await ask(conn, "order 1234")
        call, output = (e.item for e in of_type(pending, "conversation.item.added")[1:3])
        assert (call.name, json.loads(call.arguments)) == ("lookup_order", {"order_id": "1234"})
        assert json.loads(output.output) == {"status": "pending"}
        assert text_of(pending) == "looking up 1234"

        gate("order:1234").set()
        later = await receive_until(conn, "response.done")
    result = later[0]
    assert (result.type, result.item.role) == ("conversation.item.added", "system")
    assert "lookup_order completed" in result.item.content[0].text
    assert '"status":"shipped"' in result.item.content[0].text
    assert "response.created" in [e.type for e in later]
    assert text_of(later) == "order 1234 is shipped"


async def test_a_cancel_mid_answer_ends_the_response_cancelled(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "slowtext"}],
        }
        await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
        await conn.response.create()
        started = await receive_until(conn, "response.output_text.delta")
        response_id = of_type(started, "response.created")[0].response.id
        await conn.response.cancel(response_id=response_id)
        rest = await receive_until(conn, "response.done")
        done = rest[-1].response
        assert (done.id, done.status) == (response_id, "cancelled")
        assert done.status_details.reason == "client_cancelled"
        # The text item is closed as incomplete, with what was streamed of it.
        (item_done,) = of_type(rest, "response.output_item.done")
        assert item_done.item.status == "incomplete"
        streamed = text_of(started + rest)
        assert item_done.item.content[0].text == streamed
        assert "longboring" not in streamed.replace(" ", "")  # cut well before the end
        after = await ask(conn, "echo next")
    assert text_of(after) == "next"
    assert all(getattr(e, "response_id", None) != response_id for e in after)


async def test_early_audio_unknown_and_unreadable_events_get_errors_naming_them(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await conn.input_audio_buffer.append(audio="AAAA", event_id="audio-1")  # audio is off
        audio = await conn.recv()
        await conn.send({"type": "conversation.item.fold", "event_id": "weird-1"})  # type: ignore[arg-type]
        unknown = await conn.recv()
        await conn.send_raw('{"type": "response.create", "event_id": "broken-1", ')
        unreadable = await conn.recv()
        await conn.send_raw('{"type": "response.cancel", "event_id": "bad-1", "response_id": 7}')
        wrong = await conn.recv()
        update = {"type": "session.update", "event_id": "u1", "session": {"type": "realtime"}}
        await conn.send_raw(
            json.dumps({**update, "session": {"type": "realtime", "output_modalities": ["image"]}})
        )
        modality = await conn.recv()
        after = await ask(conn, "echo still here")  # the session goes on
    assert (audio.type, audio.error.event_id, audio.error.code) == (
        "error",
        "audio-1",
        "invalid_audio",
    )
    assert "output_modalities ['audio']" in audio.error.message
    assert (unknown.error.event_id, unknown.error.code) == ("weird-1", "unknown_type")
    assert (unreadable.error.code, unreadable.error.event_id) == ("invalid_message", None)
    assert "invalid JSON" in unreadable.error.message
    assert (wrong.error.event_id, wrong.error.code) == ("bad-1", "invalid_message")
    assert "response_id" in wrong.error.message
    assert (modality.error.event_id, modality.error.code) == ("u1", "invalid_message")
    assert text_of(after) == "still here"


async def test_response_create_with_nothing_to_answer_is_an_error(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await conn.response.create(event_id="empty-1")
        refused = await conn.recv()
    assert (refused.type, refused.error.event_id) == ("error", "empty-1")
    assert "nothing to answer" in refused.error.message


async def test_truncate_keeps_what_was_seen_in_the_history_and_the_next_turn(gateway):
    served, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        session_id = (await conn.recv()).session.id
        events = await ask(conn, "echo one two three four")
        (item,) = of_type(events, "response.output_item.done")
        truncate = {
            "type": "conversation.item.truncate",
            "event_id": "t1",
            "item_id": item.item.id,
            "content_index": 0,
            "audio_end_ms": 0,
            "text_end_chars": 7,
        }
        await conn.send_raw(json.dumps(truncate))
        truncated = await conn.recv()
        history = served.runtime.drivers[session_id].session.state().history
        after = await ask(conn, "echo five")
    assert truncated.type == "conversation.item.truncated"
    assert (truncated.item_id, truncated.content_index, truncated.audio_end_ms) == (
        item.item.id,
        0,
        0,
    )
    assert [t.text for t in history if isinstance(t, AssistantTurn)] == ["one two"]
    assert text_of(after) == "five"
    assert AssistantTurn(text="one two") in served.model.requests[-1].items


async def test_the_session_ends_when_the_socket_closes(gateway):
    served, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        session_id = (await conn.recv()).session.id
        assert session_id in served.runtime.drivers
    async with asyncio.timeout(5):
        await served.runtime.idle.wait()
    assert session_id not in served.runtime.drivers
    assert await served.runtime.store.ended(session_id)


async def test_a_wrong_key_is_refused_with_4001(gateway):
    served, _ = gateway
    client = AsyncOpenAI(
        api_key="not-a-key-of-this-gateway",
        websocket_base_url=f"ws://127.0.0.1:{served.port}/v1/openai",
    )
    with pytest.raises(websockets.ConnectionClosed, match="4001"):
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.recv()


async def test_a_browser_key_in_the_subprotocol_is_accepted_as_openai_js_sends_it(gateway):
    # OpenAI's browser client cannot set headers: it offers the key as a subprotocol.
    served, _ = gateway
    url = f"ws://127.0.0.1:{served.port}/v1/openai/realtime?model=gpt-realtime"
    offered = ["realtime", f"openai-insecure-api-key.{KEY}"]
    async with websockets.connect(url, subprotocols=offered) as socket:  # type: ignore[arg-type]
        created = json.loads(await socket.recv())
        assert socket.subprotocol == "realtime"
    assert created["type"] == "session.created"


# ----------------------------------------------------------------- voice segments (extension)


SEGMENTED = "echo Hello there. How are you today? Fine."


async def test_segments_asked_for_in_session_update_come_between_the_deltas_of_their_item(
    gateway,
):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        created = await conn.recv()
        assert created.session.gateway == {"segments": False}
        session = {"type": "realtime", "output_modalities": ["text"], "gateway": {"segments": True}}
        await conn.session.update(session=session, event_id="voice")  # type: ignore[arg-type]
        updated = await conn.recv()
        assert updated.type == "session.updated"
        assert updated.session.gateway == {"segments": True}
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": SEGMENTED}],
        }
        await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
        await conn.response.create()
        events: list[Any] = []
        async with asyncio.timeout(10):
            # The SDK's own iterator: an event type it does not know must not stop it.
            async for event in conn:
                events.append(event)
                if event.type == "response.done":
                    break
    assert not of_type(events, "error")
    segments = of_type(events, "response.output_text.segment")
    assert [s.text for s in segments] == ["Hello there. ", "How are you today? ", "Fine."]
    assert (
        "".join(s.text for s in segments)
        == text_of(events)
        == "Hello there. How are you today? Fine."
    )
    (delta, *_) = of_type(events, "response.output_text.delta")
    where = {(s.response_id, s.item_id, s.output_index, s.content_index) for s in segments}
    assert where == {(delta.response_id, delta.item_id, delta.output_index, delta.content_index)}
    # Each segment comes once the deltas before it hold its text, never earlier; the
    # last one comes just before response.output_text.done.
    streamed, spoken = "", ""
    for event in events:
        if event.type == "response.output_text.delta":
            streamed += event.delta
        elif event.type == "response.output_text.segment":
            spoken += event.text
            assert streamed.startswith(spoken)
    kinds = [e.type for e in events]
    done_at = kinds.index("response.output_text.done")
    assert kinds[done_at - 1] == "response.output_text.segment"
    assert kinds.index("response.output_text.segment") > kinds.index("response.output_text.delta")


async def test_a_session_that_did_not_ask_for_segments_gets_none(gateway):
    _, client = gateway
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        plain = await ask(conn, SEGMENTED)
        session = {"type": "realtime", "gateway": {"segments": True}}
        await conn.session.update(session=session)  # type: ignore[arg-type]
        await conn.recv()
        voiced = await ask(conn, SEGMENTED)
        session = {"type": "realtime", "gateway": {"segments": False}}
        await conn.session.update(session=session)  # type: ignore[arg-type]
        turned_off = await conn.recv()
        silent = await ask(conn, SEGMENTED)
    assert text_of(plain) == text_of(silent) == "Hello there. How are you today? Fine."
    assert not of_type(plain, "response.output_text.segment")
    assert len(of_type(voiced, "response.output_text.segment")) == 3
    assert turned_off.session.gateway == {"segments": False}
    assert not of_type(silent, "response.output_text.segment")


# ----------------------------------------------------------------- the Agents SDK


async def test_the_agents_sdk_runs_a_function_tool_through_the_gateway(gateway):
    agents = pytest.importorskip("agents")
    from agents.realtime import RealtimeAgent, RealtimeRunner

    served, _ = gateway
    ran: list[str] = []

    @agents.function_tool
    def device_a() -> str:
        """Client function A."""
        ran.append("device_a")
        return json.dumps({"value": "agents"})

    agent = RealtimeAgent(name="test", instructions="Be brief.", tools=[device_a])
    runner = RealtimeRunner(agent, config={"model_settings": {"output_modalities": ["text"]}})
    url = f"ws://127.0.0.1:{served.port}/v1/openai/realtime?model=gpt-realtime"
    session = await runner.run(model_config={"url": url, "api_key": KEY})
    answers: list[str] = []
    errors: list[Any] = []
    async with session:
        await session.send_message("one")
        async with asyncio.timeout(10):
            async for event in session:
                if event.type == "error":
                    errors.append(event)
                if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    raw = event.data.data
                    if raw["type"] == "response.output_text.done":
                        answers.append(raw["text"])
                        if raw["text"].startswith("A="):
                            break
    assert ran == ["device_a"]
    assert answers == ["calling A", "A=agents"]
    assert not errors


# ----------------------------------------------------------------- the codec alone


def decoded_texts(frames: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(frame) for frame in frames]


def started_codec() -> OpenAIRealtimeCodec:
    codec = OpenAIRealtimeCodec(model="m")
    created = SessionCreated(session_id="s", resume_token="r", agent="a", protocol_version=1)
    codec.encode(created, b"")
    return codec


def test_truncate_counts_audio_ms_at_fifteen_characters_a_second():
    codec = started_codec()
    codec.decode(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
            }
        )
    )
    codec.encode(ResponseCreated(response_id="r1"), b"")
    frames = codec.encode(TextDelta(response_id="r1", delta="x" * 100), b"")
    item_id = decoded_texts(frames)[1]["item"]["id"]
    codec.encode(TextDone(response_id="r1", text="x" * 100), b"")
    event = {
        "type": "conversation.item.truncate",
        "item_id": item_id,
        "content_index": 0,
        "audio_end_ms": 2000,
    }
    (message,), _ = codec.decode(json.dumps(event))
    assert isinstance(message, ResponseTruncate)
    assert (message.response_id, message.heard_chars) == ("r1", 2 * CHARS_PER_SECOND)


def test_response_create_after_the_core_response_ended_gets_an_empty_response():
    # The client answered its calls and the core went on and finished before the
    # client's response.create arrived: the SDK still waits for a response.created.
    codec = started_codec()
    codec.encode(ResponseCreated(response_id="r1"), b"")
    call = ClientCall(call_id="c1", tool="f", display_name="F", args={}, deadline=0.0, timeout=1.0)
    codec.encode(ToolCalls(response_id="r1", calls=[call]), b"")
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    (results,), _ = codec.decode(json.dumps({"type": "conversation.item.create", "item": output}))
    assert isinstance(results, ToolResults)
    assert (results.results[0].tool, results.results[0].output) == ("f", "ok")
    codec.encode(ResponseDone(response_id="r1", status="completed"), b"")
    messages, replies = codec.decode(json.dumps({"type": "response.create"}))
    assert messages == []
    assert [f["type"] for f in decoded_texts(replies)] == ["response.created", "response.done"]


def test_user_items_wait_for_response_create_and_go_as_one_message():
    codec = started_codec()
    for text in ("first", "second"):
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
        messages, replies = codec.decode(
            json.dumps({"type": "conversation.item.create", "item": item})
        )
        assert messages == []
        assert [f["type"] for f in decoded_texts(replies)] == [
            "conversation.item.added",
            "conversation.item.done",
        ]
    (message,), _ = codec.decode(json.dumps({"type": "response.create", "event_id": "e1"}))
    assert message == UserMessage(id="e1", text="first\n\nsecond")


def test_answers_before_session_created_wait_for_it():
    codec = OpenAIRealtimeCodec(model="m")
    assert codec.decode("not json").replies == []
    created = SessionCreated(session_id="s", resume_token="r", agent="a", protocol_version=1)
    frames = decoded_texts(codec.encode(created, b""))
    assert [f["type"] for f in frames] == ["session.created", "error"]


def test_the_gateway_extension_maps_to_segments_and_is_strict_unlike_the_rest():
    codec = started_codec()
    update = {
        "type": "session.update",
        "event_id": "u1",
        "session": {"type": "realtime", "tracing": "auto", "gateway": {"segments": True}},
    }
    (message,), replies = codec.decode(json.dumps(update))  # tracing: ignored, as before
    assert message == CoreSessionUpdate(id="u1", segments=True)
    assert replies == []
    (updated,) = decoded_texts(codec.encode(SessionUpdated(in_reply_to="u1"), b""))
    assert updated["session"]["gateway"] == {"segments": True}
    codec.decode(json.dumps({**update, "event_id": "u2", "session": {"instructions": "x"}}))
    (updated,) = decoded_texts(codec.encode(SessionUpdated(in_reply_to="u2"), b""))
    assert updated["session"]["gateway"] == {"segments": True}  # absent: unchanged
    for wrong in ({"segmets": True}, {"segments": "yes"}, True):
        bad = {**update, "event_id": "bad", "session": {"type": "realtime", "gateway": wrong}}
        messages, (error,) = codec.decode(json.dumps(bad))
        assert messages == []
        refused = json.loads(error)["error"]
        assert (refused["code"], refused["event_id"]) == ("invalid_message", "bad")
        assert "session.gateway" in refused["message"]


def test_a_segment_names_the_item_of_its_deltas():
    codec = started_codec()
    update = {
        "type": "session.update",
        "event_id": "u1",
        "session": {"gateway": {"segments": True}},
    }
    codec.decode(json.dumps(update))
    codec.encode(SessionUpdated(in_reply_to="u1"), b"")
    codec.encode(ResponseCreated(response_id="r1"), b"")
    started = decoded_texts(codec.encode(TextDelta(response_id="r1", delta="Hi. Yo"), b""))
    (segment,) = decoded_texts(codec.encode(TextSegment(response_id="r1", text="Hi. "), b""))
    delta = started[-1]
    assert segment == {
        "type": "response.output_text.segment",
        "event_id": segment["event_id"],
        "response_id": delta["response_id"],
        "item_id": delta["item_id"],
        "output_index": 0,
        "content_index": 0,
        "text": "Hi. ",
    }
    assert segment["event_id"] != delta["event_id"]


def test_the_v1_codec_is_the_identity():
    ping = encode(Pong(ts=1.0))
    assert V1Codec().encode(Pong(ts=1.0), ping) == [ping]
    assert V1Codec().decode('{"type": "user.message", "text": "hi"}').messages == [
        UserMessage(text="hi")
    ]

"""Every kind of bad input gets a clear error, and the same socket still works after it."""

from __future__ import annotations

import json

import pytest
import websockets

from client_sdk import connect_raw
from gateway.wire.v1 import (
    Error,
    ResponseDone,
    SessionCreated,
    SessionStart,
    ToolCalls,
    ToolResult,
    ToolResults,
)
from tests.support import running_gateway, say, say_until_calls, session, streamed_text

MAX_CHARS = 200


@pytest.fixture
async def url():
    async with running_gateway(max_message_chars=MAX_CHARS, ws_max_size=64 * 1024) as gateway_url:
        yield gateway_url


# (frame, expected code, expected in_reply_to, words the message must contain)
BAD_FRAMES = [
    ("{not json", "invalid_message", None, "invalid JSON"),
    ("", "invalid_message", None, "invalid JSON"),
    ("[1, 2]", "invalid_message", None, "JSON object"),
    ('"text"', "invalid_message", None, "JSON object"),
    ("42", "invalid_message", None, "JSON object"),
    ('{"text": "no type"}', "invalid_message", None, "type"),
    ('{"type": 7}', "invalid_message", None, "type"),
    ('{"type": "user.mesage", "id": "u1", "text": "hi"}', "unknown_type", "u1", "user.mesage"),
    ('{"type": "user.message", "id": "u2"}', "invalid_message", "u2", "text"),
    ('{"type": "user.message", "id": "u3", "text": 5}', "invalid_message", "u3", "str"),
    (
        '{"type": "user.message", "id": "u4", "text": "hi", "extra": 1}',
        "invalid_message",
        "u4",
        "extra",
    ),
    ('{"type": "user.message", "id": "u5", "text": ""}', "invalid_message", "u5", "length"),
    ('{"type": "user.message", "id": "u6", "text": "   "}', "invalid_message", "u6", "blank"),
    (
        json.dumps({"type": "user.message", "id": "u7", "text": "x" * (MAX_CHARS + 1)}),
        "message_too_large",
        "u7",
        str(MAX_CHARS),
    ),
    ('{"type": "ping", "id": "p1", "ts": "noon"}', "invalid_message", "p1", "ts"),
    ('{"type": "tool.results", "id": "t1", "results": []}', "invalid_message", "t1", "length"),
    (
        '{"type": "tool.results", "id": "t2", "results": [{"call_id": "call_x", "tool": "a"}]}',
        "unknown_call",
        "t2",
        "no client-function call",
    ),
    ('{"type": "session.start", "id": "s2"}', "invalid_message", "s2", "already started"),
    ('{"type": "response.cancel", "id": "c1", "response_id": 3}', "invalid_message", "c1", "str"),
    # Broken past the first wrong value: truncated, trailing bytes, out of range, not JSON.
    ("[1,2", "invalid_message", None, "invalid JSON"),
    ('{"type":"ping","ts":"x"}xx', "invalid_message", None, "invalid JSON"),
    ('{"type":"ping","id":"b1","ts":"x"', "invalid_message", None, "invalid JSON"),
    ('{"type": "ping", "ts": 1e999}', "invalid_message", None, "out of range"),
    ('{"type": "ping", "ts": NaN}', "invalid_message", None, "invalid JSON"),
    ('{"type": "ping", "ts": Infinity}', "invalid_message", None, "invalid JSON"),
    ('{"type": "ack", "seq": 1e400}', "invalid_message", None, "out of range"),
    (
        '{"type": "tool.results", "id": "t3", "results": [{"call_id": "c", "tool": "a", '
        f'"output": {"9" * 5000}}}]}}',
        "invalid_message",
        None,
        "out of range",
    ),
    # Valid JSON but not Unicode: half of a surrogate pair (an emoji cut in two).
    (
        '{"type": "user.message", "id": "s1", "text": "\\ud800"}',
        "invalid_message",
        "s1",
        "surrogate",
    ),
    ('{"type": "user.message", "id": "s2", "text": "a\\ude00"}', "invalid_message", "s2", "emoji"),
    (
        '{"type": "user.message", "id": "\\udfff", "text": "hi"}',
        "invalid_message",
        None,
        "surrogate",
    ),
    ('{"type": "user.message", "id": "s3", "text": "\\ud800', "invalid_message", None, "JSON"),
    ("[" * 20_000 + "]" * 20_000, "invalid_message", None, "nested too deeply"),
    ('{"type": "session.update", "metadata": ' + "[" * 20_000, "invalid_message", None, "JSON"),
    (
        '{"type": "ping", "id": "d1", "x": ' + "[" * 20_000 + "]" * 20_000 + "}",
        "invalid_message",
        None,
        "nested too deeply",
    ),
    ("\x00\x01", "invalid_message", None, "invalid JSON"),
    ("{}", "invalid_message", None, "type"),
]


async def test_every_bad_frame_gets_an_error_and_the_session_stays_usable(url):
    async with session(url) as (conn, _):
        for frame, code, in_reply_to, words in BAD_FRAMES:
            await conn.send_raw(frame)
            error = await conn.recv()
            assert isinstance(error, Error), frame
            assert (error.code, error.in_reply_to) == (code, in_reply_to), frame
            assert words in error.message, (frame, error.message)
            assert error.fatal is False
        await conn.send_raw(b'{"type": "ping"}')
        error = await conn.recv()
        assert isinstance(error, Error)
        assert error.code == "invalid_audio"
        assert "binary" in error.message
        events = await say(conn, "echo still alive")
    assert streamed_text(events) == "still alive"


async def test_bad_tool_results_get_errors_and_the_turn_completes(url):
    async with session(url) as (conn, _):
        calls: ToolCalls = await say_until_calls(conn, "one")
        call = calls.calls[0]
        both = {"call_id": call.call_id, "tool": call.tool, "output": {}, "error": "x"}
        neither = {"call_id": call.call_id, "tool": call.tool}
        for result in (both, neither):
            await conn.send_raw(
                json.dumps({"type": "tool.results", "id": "r", "results": [result]})
            )
            error = await conn.recv()
            assert isinstance(error, Error)
            assert error.code == "invalid_result"
            assert "exactly one" in error.message
        await conn.send(
            ToolResults(
                results=[ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "ok"})]
            )
        )
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "A=ok"


async def test_user_message_before_session_start_is_refused(url):
    async with connect_raw(url) as conn:
        await conn.send_raw('{"type": "user.message", "id": "early", "text": "hi"}')
        error = await conn.recv()
        assert isinstance(error, Error)
        assert (error.code, error.in_reply_to) == ("invalid_message", "early")
        assert "session.start" in error.message
        await conn.send(SessionStart())
        created = await conn.recv()
        assert isinstance(created, SessionCreated)
        events = await say(conn, "echo late but fine")
    assert streamed_text(events) == "late but fine"


@pytest.mark.parametrize(
    ("start", "words"),
    [
        ({"agent": "someone_else"}, "unknown agent"),
        ({"client_functions": [{"name": "BadName", "description": "x"}]}, "client_functions"),
        ({"client_functions": [{"name": "ok_name", "description": ""}]}, "description"),
        (
            {"client_functions": [{"name": "add", "description": "clash with a server tool"}]},
            "defined twice",
        ),
        (
            {
                "client_functions": [
                    {"name": "f", "description": "d", "input_schema": {"type": "nonsense"}}
                ]
            },
            "invalid JSON Schema",
        ),
    ],
)
async def test_bad_session_start_is_refused_and_can_be_retried(url, start, words):
    async with connect_raw(url) as conn:
        await conn.send_raw(json.dumps({"type": "session.start", "id": "s", **start}))
        error = await conn.recv()
        assert isinstance(error, Error)
        assert error.in_reply_to == "s"
        assert words in error.message
        await conn.send(SessionStart())
        assert isinstance(await conn.recv(), SessionCreated)


async def test_a_broken_session_resume_is_refused_not_turned_into_a_new_session(url):
    async with connect_raw(url) as conn:
        resume = {"type": "session.resume", "session_id": "s", "resume_token": "t", "last_seq": -1}
        await conn.send_raw(json.dumps(resume))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await conn.recv()  # no session.created, no error about an unstarted session
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert "invalid session.resume" in closed.value.rcvd.reason
    assert "last_seq" in closed.value.rcvd.reason


async def test_frame_over_the_size_limit_closes_with_1009(url):
    async with session(url) as (conn, _):
        await conn.send_raw(json.dumps({"type": "user.message", "text": "x" * 70_000}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await conn.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


async def test_gateway_survives_a_client_that_vanishes_mid_call(url):
    async with session(url) as (conn, _):
        await say_until_calls(conn, "one")
        conn.websocket.transport.abort()  # drop the TCP connection: no close frame
    async with session(url) as (conn, _):
        events = await say(conn, "echo the gateway is fine")
    assert streamed_text(events) == "the gateway is fine"


async def test_a_client_asking_only_for_another_subprotocol_is_refused(url):
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with connect_raw(url, subprotocols=["gateway.v2"]):
            pass
    assert refused.value.response.status_code == 403


async def test_a_client_offering_no_subprotocol_is_served(url):
    async with connect_raw(url, subprotocols=None) as conn:
        assert conn.websocket.subprotocol is None
        await conn.send(SessionStart())
        assert isinstance(await conn.recv(), SessionCreated)


async def test_a_socket_that_says_nothing_is_closed_with_1008():
    async with running_gateway(first_message_timeout=0.2) as url, connect_raw(url) as conn:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await conn.recv(within=5)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008

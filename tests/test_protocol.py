"""Wire protocol: round trips, decode failures, and the committed JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest

from gateway.wire.v1 import (
    ClientCall,
    DecodeFailure,
    Error,
    Ping,
    ResponseDone,
    SessionStart,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolSpec,
    ToolStatus,
    Usage,
    UserMessage,
    decode_client,
    decode_server,
    encode,
    protocol_schema,
)

SCHEMA_FILE = Path(__file__).parents[1] / "client_sdk" / "js" / "protocol.schema.json"


@pytest.mark.parametrize(
    "msg",
    [
        SessionStart(
            id="s",
            instructions="be brief",
            client_functions=[ToolSpec(name="vibrate", description="Vibrate.", timeout=2.5)],
            metadata={"user": "u1"},
        ),
        UserMessage(text="hello", id="m1"),
        ToolResults(results=[ToolResult(call_id="c", tool="t", output=None)]),
        ToolResults(results=[ToolResult(call_id="c", tool="t", error="nope")]),
        Ping(ts=1.0),
    ],
)
def test_client_messages_round_trip(msg):
    assert decode_client(encode(msg)) == msg


@pytest.mark.parametrize(
    "msg",
    [
        TextDelta(seq=3, response_id="r", delta="hi"),
        ToolCalls(
            seq=4,
            response_id="r",
            calls=[
                ClientCall(
                    call_id="c",
                    tool="t",
                    display_name="T",
                    args={"a": 1},
                    deadline=1.0,
                    timeout=1.0,
                )
            ],
        ),
        ToolStatus(seq=5, call_id="c", tool="t", status="completed", result={"x": None}),
        ResponseDone(seq=6, response_id="r", status="completed", usage=Usage(input_tokens=1)),
        Error(seq=7, code="busy", message="wait", in_reply_to="m"),
    ],
)
def test_server_messages_round_trip(msg):
    assert decode_server(encode(msg)) == msg


def test_null_output_is_kept_apart_from_a_missing_output():
    with_null = decode_client(
        b'{"type":"tool.results","results":[{"call_id":"c","tool":"t","output":null}]}'
    )
    missing = decode_client(b'{"type":"tool.results","results":[{"call_id":"c","tool":"t"}]}')
    assert isinstance(with_null, ToolResults)
    assert with_null.results[0].output is None
    assert isinstance(missing, ToolResults)
    assert missing.results[0].output is msgspec.UNSET


def test_server_messages_omit_defaults_and_clients_ignore_unknown_fields():
    assert json.loads(encode(TextDelta(seq=1, response_id="r", delta="x"))) == {
        "type": "text.delta",
        "seq": 1,
        "response_id": "r",
        "delta": "x",
    }
    newer = b'{"type":"text.delta","seq":1,"response_id":"r","delta":"x","added_later":true}'
    assert decode_server(newer) == TextDelta(seq=1, response_id="r", delta="x")


@pytest.mark.parametrize(
    ("frame", "code", "in_reply_to"),
    [
        (b"{", "invalid_message", None),
        (b"null", "invalid_message", None),
        (b'{"type":"nope","id":"a"}', "unknown_type", "a"),
        (b'{"type":"user.message","id":"b","text":"x","more":1}', "invalid_message", "b"),
        (b'{"type":"user.message","id":{"nested":1}}', "invalid_message", None),
        (
            b'{"type":"session.start","client_functions":[{"name":"Bad","description":"d"}]}',
            "invalid_message",
            None,
        ),
    ],
)
def test_decode_failures_are_values_not_exceptions(frame, code, in_reply_to):
    failure = decode_client(frame)
    assert isinstance(failure, DecodeFailure)
    assert (failure.code, failure.in_reply_to) == (code, in_reply_to)


def test_committed_schema_matches_the_code():
    committed = json.loads(SCHEMA_FILE.read_text())
    assert committed == json.loads(json.dumps(protocol_schema())), (
        "client_sdk/js/protocol.schema.json is stale: run `make schema`"
    )


def test_schema_validates_real_messages():
    schema = protocol_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(json.loads(encode(UserMessage(text="hi"))))
    validator.validate(json.loads(encode(TextDelta(seq=1, response_id="r", delta="x"))))
    assert not validator.is_valid({"type": "user.message", "text": "hi", "bogus": 1})

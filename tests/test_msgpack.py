"""``gateway.v1.msgpack``: the same conversations as v1 JSON, over binary MessagePack frames.

Each end-to-end test runs with the Python SDK in both framings (``protocol="json"`` and
``"msgpack"``): a client function's call and its result, an async tool's pending status and
its later result starting a response, a resume after the socket is cut mid-answer with
nothing lost and nothing twice. Then the frames themselves: they really are MessagePack
(and smaller), bad frames get errors, and a gateway picks JSON for a client that offers
only ``gateway.v1``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from websockets.asyncio.client import connect as ws_connect

from client_sdk import connect
from gateway.wire.audio_frame import AnswerAudio
from gateway.wire.msgpack import SUBPROTOCOL_MSGPACK
from gateway.wire.v1 import (
    AudioDone,
    Outbound,
    ResponseCreated,
    ResponseDone,
    SessionResumed,
    TextDelta,
    ToolStatus,
)
from tests.data.tools import gate, reset_gates
from tests.proxy import Proxy, proxy_to
from tests.realtime_upstream import Call, RealtimeUpstream, Say, tone
from tests.support import Gateway, serving
from tests.test_realtime_provider import (
    SILENCE,
    SPEECH,
    answer_battery,
    collect,
    realtime_gateway,
    say,
)

PROTOCOLS = pytest.mark.parametrize("protocol", ["json", "msgpack"])


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    reset_gates()
    async with serving(scripted_pace=0.0) as running:
        yield running


async def next_of(events: AsyncIterator[Outbound], kind: type, seen: list[Outbound]) -> Any:
    async with asyncio.timeout(10):
        async for event in events:
            seen.append(event)
            if isinstance(event, kind):
                return event
    raise AssertionError(f"events ended before a {kind.__name__}")


@PROTOCOLS
async def test_a_client_functions_call_and_its_result(gateway: Gateway, protocol: str):
    async with connect(gateway.url, protocol=protocol) as conv:  # type: ignore[arg-type]

        @conv.client_function("device_a")
        async def device_a() -> dict[str, Any]:
            return {"value": protocol}

        text = "".join([delta async for delta in conv.say("one")])
        subprotocol = conv._ws.subprotocol if conv._ws is not None else None
    assert text == f"calling A A={protocol}"
    assert subprotocol == (SUBPROTOCOL_MSGPACK if protocol == "msgpack" else "gateway.v1")


@PROTOCOLS
async def test_an_async_tools_pending_status_then_its_result_starts_a_response(
    gateway: Gateway, protocol: str
):
    async with connect(gateway.url, protocol=protocol) as conv:  # type: ignore[arg-type]
        events = conv.events()
        first = "".join([delta async for delta in conv.say("order 1234")])
        seen: list[Outbound] = []
        gate("order:1234").set()
        completed = await next_of(events, ToolStatus, seen)
        while completed.status != "completed":
            completed = await next_of(events, ToolStatus, seen)
        created = await next_of(events, ResponseCreated, seen)
        await next_of(events, ResponseDone, seen)
    assert first == "looking up 1234"
    assert completed.result == {"order_id": "1234", "status": "shipped"}
    assert created.call_id == completed.call_id
    later = "".join(e.delta for e in seen if isinstance(e, TextDelta))
    assert later.endswith("order 1234 is shipped")


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[Proxy]:
    async with proxy_to(gateway.port) as running:
        yield running


@PROTOCOLS
async def test_a_resume_after_a_cut_mid_answer_loses_nothing_and_repeats_nothing(
    gateway: Gateway, proxy: Proxy, protocol: str
):
    async with connect(proxy.url(), protocol=protocol) as conv:  # type: ignore[arg-type]
        await conv.start()
        events = conv.events()
        await conv.post("slowtext")
        seen: list[Outbound] = []
        await next_of(events, TextDelta, seen)
        proxy.drop()  # no close frame: the SDK resumes on a new socket
        resumed = await next_of(events, SessionResumed, seen)
        await next_of(events, ResponseDone, seen)
    text = "".join(e.delta for e in seen if isinstance(e, TextDelta))
    assert text.startswith("this answer streams slowly word by word")
    assert text.endswith("rather boring sentence that goes on and on")
    seqs = [e.seq for e in seen if e.seq]
    assert seqs == sorted(set(seqs))  # every event once, in order
    assert resumed.replayed_from > 1  # the events it missed came again, once


async def test_the_frames_are_messagepack_and_smaller_than_json(gateway: Gateway):
    sizes: dict[str, int] = {}
    for protocol in (SUBPROTOCOL_MSGPACK, "gateway.v1"):
        async with ws_connect(gateway.url, subprotocols=[protocol]) as ws:  # type: ignore[list-item]
            start: dict[str, Any] = {"type": "session.start"}
            message = {"type": "user.message", "id": "m1", "text": "echo one two three four"}
            total = 0
            for msg in (start, message):
                await ws.send(
                    msgspec.msgpack.encode(msg)
                    if protocol == SUBPROTOCOL_MSGPACK
                    else msgspec.json.encode(msg).decode()
                )
            while True:
                frame = await ws.recv()
                total += len(frame)
                if protocol == SUBPROTOCOL_MSGPACK:
                    assert isinstance(frame, bytes)
                    event = msgspec.msgpack.decode(frame)
                else:
                    assert isinstance(frame, str)
                    event = msgspec.json.decode(frame)
                if event["type"] == "response.done":
                    break
            sizes[protocol] = total
    # session.created carries a resume token and ids alike in both: the events differ by
    # their framing alone.
    assert sizes[SUBPROTOCOL_MSGPACK] < sizes["gateway.v1"]


async def test_bad_frames_get_errors_and_the_session_goes_on(gateway: Gateway):
    async with ws_connect(gateway.url, subprotocols=[SUBPROTOCOL_MSGPACK]) as ws:  # type: ignore[list-item]
        await ws.send(msgspec.msgpack.encode({"type": "session.start"}))
        assert msgspec.msgpack.decode(await ws.recv())["type"] == "session.created"
        answers = []
        for bad in (
            '{"type": "ping"}',  # a text frame
            b"\xc1",  # never used in MessagePack
            msgspec.msgpack.encode({"type": "user.message", "id": "x1"}),  # no text
            msgspec.msgpack.encode({"type": "teleport", "id": "x2"}),
            msgspec.msgpack.encode([1, 2, 3]),  # not a map
            msgspec.msgpack.encode({"type": "audio", "pcm": "not bytes"}),
        ):
            await ws.send(bad)
            answers.append(msgspec.msgpack.decode(await ws.recv()))
        await ws.send(
            msgspec.msgpack.encode({"type": "user.message", "id": "ok", "text": "echo fine"})
        )
        while (event := msgspec.msgpack.decode(await ws.recv()))["type"] != "response.done":
            pass
    codes = [(a["type"], a["code"], a.get("in_reply_to")) for a in answers]
    assert codes == [
        ("error", "invalid_message", None),
        ("error", "invalid_message", None),
        ("error", "invalid_message", "x1"),
        ("error", "unknown_type", "x2"),
        ("error", "invalid_message", None),
        ("error", "invalid_audio", None),
    ]
    assert event["status"] == "completed"
    assert "audio, input_audio.clear" in answers[3]["message"]  # the kinds it may send


async def test_audio_both_ways_as_raw_bytes_in_maps():
    """A spoken turn (a speech-to-speech model upstream, the scripted one: quick): the
    user's audio goes up as ``audio`` maps, the answer's comes back as ``audio`` maps, the
    samples as they were."""
    reset_gates()
    script = [Call("get_battery_level", {}), Say("At 82 percent.")]
    async with (
        RealtimeUpstream(script, transcripts=["what is my battery level"]) as upstream,
        realtime_gateway(upstream) as gateway,
        connect(gateway.url, audio={"output_rate": 24000}, protocol="msgpack") as conv,
    ):
        answer_battery(conv)
        await conv.start()
        events, frames = conv.events(), list[AnswerAudio]()
        reading = asyncio.create_task(collect(conv.audio(), frames))
        await say(conv, SILENCE[:8000] + SPEECH + SILENCE)
        seen: list[Outbound] = []
        done = await next_of(events, AudioDone, seen)
        reading.cancel()
    assert conv_subprotocol_was_msgpack(upstream)
    pcm = b"".join(f.pcm for f in frames if f.response_id == done.response_id)
    assert pcm == tone("At 82 percent.", 24000)


def conv_subprotocol_was_msgpack(upstream: RealtimeUpstream) -> bool:
    """The user's audio reached the upstream model (so the gateway read the ``audio`` maps)."""
    return bool(upstream.received("input_audio_buffer.append"))

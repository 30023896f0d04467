"""Nothing a model server sends ends a session: whatever the gateway cannot handle in a
model's output fails that response (an ``error``, then ``response.done status=failed``),
and the session goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from client_sdk.connection import Connection
from gateway.core.event import ModelOutput
from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall
from gateway.core.session import Session
from gateway.wire.v1 import Error, ResponseDone, ToolCalls, UserMessage
from tests.support import serving, session, streamed_text


class _OddModel:
    """A model that says ``first``, then ``events`` once, then plain text."""

    name = "odd"

    def __init__(self, *events: ModelEvent) -> None:
        self.events = list(events)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        events, self.events = self.events, []
        for event in events or [ModelText("fine"), ModelFinish()]:
            yield event

    async def aclose(self) -> None:
        pass


# A JSON integer (valid, and Python reads it) that no MessagePack state can hold.
_HUGE = ModelToolCall(name="device_a", args={"qty": 10**30})


@pytest.mark.parametrize(
    ("events", "words", "status"),
    [
        ((_HUGE, ModelFinish()), "cannot carry (device_a", "failed"),
        ((ModelText("Let me check. "), _HUGE, ModelFinish()), "cannot carry", "incomplete"),
        ((ModelText(5), ModelFinish()), "unexpectedly", "failed"),  # type: ignore[arg-type]
        ((ModelToolCall(name="device_a", args=[1]), ModelFinish()), "arguments", "failed"),  # type: ignore[arg-type]
    ],
)
async def test_model_output_the_gateway_cannot_carry_fails_the_response_only(events, words, status):
    async with serving() as gateway, session(gateway.url) as (conn, _):
        gateway.model.inner = _OddModel(*events)  # type: ignore[assignment]
        await _fails_then_goes_on(conn, words, status)


async def _fails_then_goes_on(conn: Connection, words: str, status: str) -> None:
    await conn.send(UserMessage(text="hi"))
    sent = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert not [e for e in sent if isinstance(e, ToolCalls)]  # no call was made
    (error,) = [e for e in sent if isinstance(e, Error)]
    assert error.code == "provider_error"
    assert words in error.message
    done = sent[-1]
    assert isinstance(done, ResponseDone)
    assert (done.status, error.response_id) == (status, done.response_id)
    await conn.send(UserMessage(text="again"))
    again = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(again) == "fine"


async def test_a_failure_of_the_core_on_a_model_event_fails_the_response_only(monkeypatch):
    original = Session.receive

    def receive(self: Session, event: object, now: float) -> None:
        if isinstance(event, ModelOutput) and event.event == ModelText("boom"):
            raise RuntimeError("a bug the model's output found")
        original(self, event, now=now)  # type: ignore[arg-type]

    original_text = Session.model_text

    def model_text(self: Session, step_id: str, text: str, *, now: float) -> None:
        # The driver's entry for a text delta on its short path: the same bug there.
        if text == "boom":
            raise RuntimeError("a bug the model's output found")
        original_text(self, step_id, text, now=now)

    monkeypatch.setattr(Session, "receive", receive)
    monkeypatch.setattr(Session, "model_text", model_text)
    async with serving() as gateway, session(gateway.url) as (conn, _):
        gateway.model.inner = _OddModel(ModelText("boom"), ModelFinish())  # type: ignore[assignment]
        await _fails_then_goes_on(conn, "could not handle the model's output", "failed")

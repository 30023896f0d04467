"""Text from a model server made safe to send: surrogate halves cut across chunks."""

from __future__ import annotations

from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelToolCall
from gateway.core.text import SurrogatePairer, without_lone_surrogates
from gateway.wire.v1 import ResponseDone, TextDelta, UserMessage, encode
from tests.support import serving, session, streamed_text


def _through(*events: ModelEvent) -> list[ModelEvent]:
    pairer = SurrogatePairer()
    return [out for event in events for out in pairer.events(event)]


def test_an_emoji_cut_between_its_halves_is_joined_again():
    out = _through(ModelText("Hello \ud83d"), ModelText("\ude00 world"), ModelFinish())
    assert out == [ModelText("Hello "), ModelText("😀 world"), ModelFinish()]


def test_a_half_alone_becomes_a_replacement_character():
    out = _through(ModelText("a\ude00b"), ModelText("c\ud83d"), ModelFinish())
    assert out == [ModelText("a\ufffdb"), ModelText("c"), ModelText("\ufffd"), ModelFinish()]
    assert without_lone_surrogates("plain text") == "plain text"


def test_tool_arguments_with_halves_are_cleaned():
    (call,) = _through(ModelToolCall(name="note", args={"text": ["x\ud83d\ude00", "\udc00"]}))
    assert call == ModelToolCall(name="note", args={"text": ["x😀", "\ufffd"]})
    encode(TextDelta(response_id="r", delta=str(call.args)))  # encodes as UTF-8


class _SplittingModel:
    """A model server that cuts an emoji between its UTF-16 halves, as a Node server did."""

    name = "splitting"

    async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def]
        yield ModelText("Hello \ud83d")
        yield ModelText("\ude00 world")
        yield ModelFinish()

    async def aclose(self) -> None:
        pass


async def test_an_emoji_split_by_the_model_server_reaches_the_client_whole():
    async with serving() as gateway, session(gateway.url) as (conn, _):
        gateway.model.inner = _SplittingModel()  # type: ignore[assignment]
        await conn.send(UserMessage(text="hi"))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert streamed_text(events) == "Hello 😀 world"
        done = events[-1]
        assert isinstance(done, ResponseDone)
        assert done.status == "completed"
        # The session goes on.
        await conn.send(UserMessage(text="again"))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert streamed_text(events) == "Hello 😀 world"

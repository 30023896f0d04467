"""Voice sessions (segments): the answers' text also goes out as speakable text.segment
events, whole sentences or clauses as soon as they are complete. In the session core (live
and restored after every event), after a node died mid-step, and over a real socket."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from client_sdk import connect
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.session import Session
from gateway.core.state import decode_state, encode_state
from gateway.wire.v1 import (
    ServerMsg,
    SessionUpdate,
    TextDelta,
    TextDone,
    TextSegment,
    UserMessage,
)
from tests.support import serving
from tests.test_session import Harness, persisted  # noqa: F401
from tests.test_tool_choice_e2e import run_js

STORY = ["Sure, I can help with that, ", "of course. The lamp is on. ", "It is 3.5 m tall!"]


def segments(sent: list[ServerMsg]) -> list[str]:
    return [m.text for m in sent if isinstance(m, TextSegment)]


def test_segments_come_as_soon_as_complete_and_join_to_the_text():
    h = Harness()
    h.start(segments=True)
    h.feed(UserMessage(text="tell me"))
    first = h.model(ModelText(STORY[0]))
    assert segments(first) == []  # "Sure, I can help with that," waits for what follows
    second = h.model(ModelText(STORY[1]))
    assert [type(m) for m in second] == [TextDelta, TextSegment, TextSegment]
    # An early first clause, then a sentence once the next one starts.
    assert segments(second) == ["Sure, I can help with that, ", "of course. "]
    rest = h.model(ModelText(STORY[2]), ModelFinish())
    assert segments(rest) == ["The lamp is on. ", "It is 3.5 m tall!"]
    assert isinstance(
        rest[rest.index(next(m for m in rest if isinstance(m, TextDone))) - 1], TextSegment
    )  # the last segment comes just before text.done
    assert "".join(segments(h.sent)) == "".join(STORY)


def test_each_model_step_ends_with_its_last_segment():
    h = Harness()
    h.start(segments=True)
    h.feed(UserMessage(text="weather"))
    sent = h.model(ModelText("Let me check"), ModelToolCall(name="weather", args={}), ModelFinish())
    assert segments(sent) == ["Let me check"]


def test_without_segments_no_segment_is_sent_and_an_update_turns_them_on():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="one"))
    assert segments(h.model(ModelText("One. Two. "), ModelFinish())) == []
    h.feed(SessionUpdate(segments=True))
    h.feed(UserMessage(text="two"))
    assert segments(h.model(ModelText("Three. Four."), ModelFinish())) == ["Three. ", "Four."]


def test_a_step_run_again_on_another_node_sends_no_segment_twice():
    h = Harness()
    h.start(segments=True)
    h.feed(UserMessage(text="tell me"))
    h.model(ModelText("First sentence here. Second sen"))
    assert segments(h.sent) == ["First sentence here. "]
    # The node dies; another restores the last saved state and runs the step again.
    h.session = Session.restore(
        h.settings, decode_state(encode_state(h.session.state())), new_id=h.new_id
    )
    h.session.adopt(h.now)
    h.other += h.session.effects()  # the step's new CallModel
    h.model(ModelText("First sentence here. Second sentence. Third."), ModelFinish())
    assert segments(h.sent) == ["First sentence here. ", "Second sentence. ", "Third."]


async def test_the_python_sdk_gets_segments_over_a_real_socket():
    async with serving() as gateway, connect(gateway.url, segments=True) as conv:
        events = conv.events()
        text = "".join([d async for d in conv.say("echo Hello there. How are you today? Fine.")])
        got = []
        async with asyncio.timeout(10):
            async for event in events:
                if isinstance(event, TextSegment):
                    got.append(event.text)
                if isinstance(event, TextDone):
                    break
    assert got == ["Hello there. ", "How are you today? ", "Fine."]
    assert "".join(got) == text


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
async def test_the_js_sdk_gets_segments_and_truncates():
    result = await run_js(Path(__file__).parent / "js" / "live_voice.mjs")
    assert "".join(result["segments"]) == result["text"]
    assert result["segments"][0] == "Hello! "
    assert len(result["segments"]) > 1
    assert result["truncated"] == [[result["latest"], 6, result["truncateId"]]]


def test_turning_segments_off_mid_answer_applies_from_the_next_response():
    h = Harness()
    h.start(segments=True)
    h.feed(UserMessage(text="one"))
    h.model(ModelText("First one. Sec"))
    h.feed(SessionUpdate(segments=False))
    h.model(ModelText("ond one."), ModelFinish())
    assert segments(h.sent) == ["First one. ", "Second one."]  # this answer whole
    h.feed(UserMessage(text="two"))
    assert segments(h.model(ModelText("Third. Fourth."), ModelFinish())) == []

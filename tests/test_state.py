"""A session's state as a value: persist, reload, continue = never persisted.

Random event sequences drive two sessions side by side: one lives in memory the whole
time, the other is encoded, decoded and restored (as a store and another node would)
at random points. They must produce the same effects, event for event.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from gateway.core.event import (
    CallModel,
    Effect,
    Event,
    ModelFailed,
    ModelOutput,
    RunTool,
    Send,
    Tick,
    ToolFinished,
    ToolProgress,
)
from gateway.core.model import ModelFinish, ModelText, ModelToolCall, ModelUsage
from gateway.core.session import Session
from gateway.core.state import decode_state, encode_state
from gateway.wire.v1 import (
    Ack,
    DecodeFailure,
    Ping,
    ResponseCancel,
    SessionStart,
    SessionUpdate,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolSpec,
    ToolStatus,
    UserMessage,
)
from tests.test_session import Harness, start_async

_VIBRATE = ToolSpec(name="vibrate", description="Vibrate.", input_schema={"type": "object"})


class _Twins:
    """The same session twice: ``live`` never persisted, ``restored`` reloaded often."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.live = Harness(max_history_chars=400)
        self.restored = Harness(max_history_chars=400)
        self.now = 1000.0
        self.step_id: str | None = None
        self.client_calls: list[tuple[str, str]] = []
        self.server_calls: list[str] = []
        self.restores = 0

    def feed(self, event: Event) -> None:
        expected = self._apply(self.live.session, event)
        got = self._apply(self.restored.session, event)
        assert got == expected, f"after {event!r}"
        self._learn(expected)
        if self.rng.random() < 0.5:
            self.reload()

    def adopt(self) -> None:
        self.live.session.adopt(self.now)
        self.restored.session.adopt(self.now)
        expected, got = self.live.session.effects(), self.restored.session.effects()
        assert got == expected
        self._learn(expected)

    def reload(self) -> None:
        data = encode_state(self.restored.session.state())
        self.restored.session = Session.restore(
            self.restored.settings, decode_state(data), new_id=self.restored.new_id
        )
        self.restores += 1

    def _apply(self, session: Session, event: Event) -> list[Effect]:
        session.receive(event, now=self.now)
        effects = session.effects()
        # Compare values as they are now: the effects share objects the core mutates.
        return copy.deepcopy(effects)

    def _learn(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case CallModel(step_id=step_id):
                    self.step_id = step_id
                case RunTool(call_id=call_id):
                    self.server_calls.append(call_id)
                case Send(msg=ToolCalls(calls=calls)):
                    self.client_calls += [(c.call_id, c.tool) for c in calls]


def _random_event(t: _Twins) -> Event | None:
    rng = t.rng
    choice = rng.randrange(14)
    step = t.step_id
    if choice == 0:
        return UserMessage(
            text=rng.choice(["hi", "lamp please", "x" * 50]), id=f"m{rng.randrange(6)}"
        )
    if choice in (1, 2, 3) and step:
        return ModelOutput(step, ModelText(text=rng.choice(["Hel", "lo ", "wörld 😀", ""])))
    if choice == 4 and step:
        name = rng.choice(["lamp", "weather", "track", "track_now", "track_quietly", "vibrate"])
        args: dict[str, Any] = {"on": rng.random() < 0.8} if name == "lamp" else {}
        return ModelOutput(step, ModelToolCall(name=name, args=args))
    if choice in (5, 6) and step:
        usage = ModelUsage(input_tokens=3, output_tokens=rng.randrange(9))
        return ModelOutput(step, ModelFinish(usage=usage))
    if choice == 7 and t.client_calls:
        call_id, tool = rng.choice(t.client_calls)
        result = (
            ToolResult(call_id=call_id, tool=tool, output={"ok": True})
            if rng.random() < 0.8
            else ToolResult(call_id=call_id, tool=tool, error="no lamp")
        )
        return ToolResults(results=[result], id=f"r{rng.randrange(100)}")
    if choice == 8 and t.server_calls:
        call_id = rng.choice(t.server_calls)
        if rng.random() < 0.3:
            return ToolProgress(call_id=call_id, payload={"done": rng.randrange(10)})
        return ToolFinished(call_id=call_id, output={"status": "shipped"})
    if choice == 9:
        t.now += rng.choice([0.5, 3.0, 11.0, 70.0])
        return Tick()
    if choice == 10:
        return rng.choice(
            [
                ResponseCancel(),
                Ping(ts=1.0),
                Ack(seq=1),
                DecodeFailure(code="invalid_message", message="bad"),
                SessionUpdate(instructions="be brief", client_functions=[_VIBRATE], id="u"),
            ]
        )
    if choice == 11 and step:
        return ModelFailed(step, "upstream broke")
    return None


@pytest.mark.parametrize("seed", range(150))
def test_a_restored_session_carries_on_exactly_like_one_never_persisted(seed: int) -> None:
    twins = _Twins(random.Random(seed))
    twins.feed(SessionStart(client_functions=[_VIBRATE], metadata={"seed": seed}))
    for _ in range(80):
        if twins.rng.random() < 0.05:
            twins.adopt()
            continue
        event = _random_event(twins)
        if event is not None:
            twins.feed(event)
    assert twins.restores > 0
    assert twins.restored.session.state() == twins.live.session.state()


def test_a_step_lost_with_its_node_runs_again_without_repeating_sent_text() -> None:
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hi"))
    h.model(ModelText(text="Hello "), ModelText(text="wor"))
    state = decode_state(encode_state(h.session.state()))
    h.session = Session.restore(h.settings, state, new_id=h.new_id)  # on another node
    h.session.adopt(h.now)
    again = [e for e in h.session.effects() if isinstance(e, CallModel)]
    assert len(again) == 1
    h.other.append(again[0])
    sent = h.model(ModelText(text="Hello world"), ModelText(text="!"), ModelFinish())
    deltas = [m.delta for m in sent if isinstance(m, TextDelta)]
    assert deltas == ["ld", "!"]  # "Hello wor" reached the client before the node stopped


def test_a_step_run_again_that_says_something_else_ends_the_response_incomplete() -> None:
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hi"))
    h.model(ModelText(text="Hello"))
    h.session.adopt(h.now)
    h.other += h.session.effects()
    sent = h.model(ModelText(text="Goodbye"))
    assert [type(m).__name__ for m in sent] == ["Error", "ResponseDone"]
    assert sent[0].code == "response_interrupted"  # type: ignore[attr-defined]
    assert sent[1].status == "incomplete"  # type: ignore[attr-defined]
    assert not [m for m in sent if isinstance(m, TextDelta)]


def test_a_state_saved_before_a_stream_catches_up_from_the_deltas_sent_since() -> None:
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hi"))
    h.model(ModelText(text="Hel"))
    saved = encode_state(h.session.state())  # the last state saved; then only deltas
    sent = h.model(ModelText(text="lo "))
    sent += h.feed(Ping(ts=1.0))  # pings and unreadable frames only add to the log too
    sent += h.feed(DecodeFailure(code="invalid_message", message="bad"))
    sent += h.model(ModelText(text="world"))
    assert len(sent) == 4
    restored = Session.restore(h.settings, decode_state(saved), new_id=h.new_id)
    assert restored.catch_up(sent)
    assert restored.state() == h.session.state()
    # Anything but the next delta of the streaming step stops it.
    again = Session.restore(h.settings, decode_state(saved), new_id=h.new_id)
    assert not again.catch_up(list(reversed(sent)))


def test_a_server_tool_left_on_a_node_fails_at_its_deadline_saying_so() -> None:
    h = Harness()
    h.start()
    call_id = start_async(h)  # the async tool runs on this node...
    state = decode_state(encode_state(h.session.state()))
    h.session = Session.restore(h.settings, state, new_id=h.new_id)  # ...which then died
    h.session.adopt(h.now)
    assert h.session.effects() == []  # nothing runs it again
    h.now = h.session.next_deadline() or 0.0
    failed, _ = h.feed(Tick())
    assert isinstance(failed, ToolStatus)
    assert (failed.call_id, failed.status) == (call_id, "failed")
    assert failed.error is not None
    assert failed.error.startswith("tool_timeout: the tool was running on another gateway node")

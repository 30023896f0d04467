"""The commit policy, pure: what a batch commits, and when a commit saves the whole state."""

from __future__ import annotations

import msgspec

from gateway.core.call import Call
from gateway.core.durability import (
    CHECKPOINT_EVENTS,
    CHECKPOINT_SIZE,
    Checkpoints,
    Sends,
    split_batch,
)
from gateway.core.event import CancelModel, Effect, ModelOutput, SaveCall, Send, ToolFinished
from gateway.core.inbound import Ack, Ping, UserMessage
from gateway.core.model import ModelFinish, ModelText
from gateway.core.outbound import Pong, TextDelta

_CALL = Call(
    call_id="call_1",
    tool="lamp",
    display_name="Lamp",
    kind="server",
    args={},
    response_id="resp_1",
    deadline=1000.0,
)


def _sends(count: int, size: int = 10) -> Sends:
    return [(Pong(), b"x" * size) for _ in range(count)]


def test_a_batch_commits_its_events_each_encoded_once_and_its_calls_in_order():
    first, second = TextDelta(response_id="r", delta="a", seq=1), Pong(seq=2)
    effects: list[Effect] = [Send(first), SaveCall(_CALL), CancelModel("step_1"), Send(second)]
    encoded: list[object] = []

    def encode(msg: object) -> bytes:
        encoded.append(msg)
        return msgspec.json.encode(msg)

    sends, calls = split_batch(effects, encode)

    assert sends == [(first, msgspec.json.encode(first)), (second, msgspec.json.encode(second))]
    assert calls == [_CALL]
    assert encoded == [first, second]  # the log and the socket get the same bytes


def test_a_batch_of_no_events_commits_nothing():
    assert split_batch([CancelModel("step_1")], msgspec.json.encode) == ([], [])


def test_without_a_durable_store_no_commit_saves_the_state():
    checkpoints = Checkpoints(durable=False, saved_seq=0)
    checkpoints.applied(UserMessage(text="hi"))
    assert not checkpoints.saves_state(_sends(1))
    assert checkpoints.trim_bound(40) == 40  # the log goes as far as the client acks


def test_events_that_only_add_to_the_log_save_no_state():
    checkpoints = Checkpoints(durable=True, saved_seq=0)
    for event in (Ping(), Ack(seq=1), ModelOutput("step_1", ModelText("word "))):
        checkpoints.applied(event)
        assert checkpoints.log_only
        assert not checkpoints.saves_state(_sends(1))


def test_any_other_event_saves_the_state_at_the_next_commit_only():
    checkpoints = Checkpoints(durable=True, saved_seq=0)
    checkpoints.applied(ModelOutput("step_1", ModelFinish()))
    assert not checkpoints.log_only
    assert checkpoints.saves_state(_sends(1))
    assert not checkpoints.saves_state(_sends(1))  # the next batch starts afresh
    checkpoints.applied(ToolFinished(call_id="call_1", output="ok"))
    assert checkpoints.saves_state([])


def test_a_change_beyond_the_log_saves_the_state():
    checkpoints = Checkpoints(durable=True, saved_seq=0)
    checkpoints.changed()  # the core failed on an event, a commit was lost
    assert checkpoints.saves_state([])


def test_a_long_stream_saves_the_state_every_so_many_events():
    checkpoints = Checkpoints(durable=True, saved_seq=0)
    saved = [checkpoints.saves_state(_sends(1)) for _ in range(2 * CHECKPOINT_EVENTS)]
    assert saved.count(True) == 2
    assert saved.index(True) == CHECKPOINT_EVENTS - 1


def test_a_long_stream_saves_the_state_every_so_many_bytes():
    checkpoints = Checkpoints(durable=True, saved_seq=0)
    assert not checkpoints.saves_state(_sends(1, CHECKPOINT_SIZE - 1))
    assert checkpoints.saves_state(_sends(1, 1))
    assert not checkpoints.saves_state(_sends(1, 1))


def test_an_adopted_session_saves_its_state_at_the_first_commit():
    checkpoints = Checkpoints(durable=True, saved_seq=7, log_only=False)
    assert checkpoints.saves_state([])


def test_the_log_is_never_trimmed_past_the_last_state_saved():
    checkpoints = Checkpoints(durable=True, saved_seq=10)
    assert checkpoints.trim_bound(25) == 10  # a node taking over catches up from 10
    assert checkpoints.trim_bound(5) == 5
    checkpoints.saved(30)
    assert checkpoints.trim_bound(25) == 25

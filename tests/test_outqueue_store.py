"""The pure pieces of lossless sessions: the outbound queue and the memory store."""

from __future__ import annotations

from gateway.core.call import Call, CallState
from gateway.shell.outqueue import OutboundQueue
from gateway.store import MemoryStore, SessionRecord
from gateway.wire.v1 import Pong, TextDelta, decode_server, encode


def delta(seq: int, text: str, response_id: str = "r") -> tuple[TextDelta, bytes]:
    msg = TextDelta(seq=seq, response_id=response_id, delta=text)
    return msg, encode(msg)


def test_queue_keeps_deltas_apart_below_the_soft_bound():
    queue = OutboundQueue(soft_size=10_000, hard_size=20_000)
    for seq in range(1, 4):
        assert queue.push(*delta(seq, f"w{seq} "))
    assert (len(queue), queue.merged) == (3, 0)


def test_queue_merges_consecutive_deltas_of_one_response_past_the_soft_bound():
    queue = OutboundQueue(soft_size=100, hard_size=10_000)
    for seq in range(1, 30):
        assert queue.push(*delta(seq, f"w{seq} "))
    assert queue.merged > 0
    sent = [decode_server(data) for data in iter(queue.pop, None)]
    assert all(isinstance(e, TextDelta) for e in sent)
    assert "".join(e.delta for e in sent if isinstance(e, TextDelta)) == "".join(
        f"w{seq} " for seq in range(1, 30)
    )
    seqs = [e.seq for e in sent]
    assert seqs == sorted(seqs)
    assert seqs[-1] == 29  # the merged event carries the newest seq
    assert queue.size == 0


def test_queue_never_merges_across_responses_or_other_events():
    queue = OutboundQueue(soft_size=0, hard_size=10_000)
    queue.push(*delta(1, "a", "r1"))
    queue.push(*delta(2, "b", "r2"))
    pong = Pong(seq=3)
    queue.push(pong, encode(pong))
    queue.push(*delta(4, "c", "r2"))
    assert (len(queue), queue.merged) == (4, 0)


def test_queue_refuses_past_the_hard_bound_but_takes_one_big_event_alone():
    queue = OutboundQueue(soft_size=10, hard_size=100)
    big = Pong(seq=1, ts=1.0)
    assert queue.push(big, b"x" * 500)  # alone: must get through
    assert not queue.push(*delta(2, "y"))


async def test_store_replays_after_a_seq_and_reports_gaps():
    store = MemoryStore(max_events=3)
    await store.create_session(
        SessionRecord(session_id="s", token_hash="h", agent="a", created_at=0)
    )
    for seq in range(1, 6):
        await store.append_event("s", seq, f"e{seq}".encode())
    assert await store.events_after("s", 2) == [b"e3", b"e4", b"e5"]
    assert await store.events_after("s", 4) == [b"e5"]
    assert await store.events_after("s", 1) is None  # e2 was dropped: a gap
    await store.trim_events("s", 4)
    assert await store.events_after("s", 3) is None
    assert await store.events_after("s", 4) == [b"e5"]


async def test_store_keeps_a_copy_of_calls_and_forgets_ended_sessions():
    store = MemoryStore(max_calls=1)
    await store.create_session(
        SessionRecord(session_id="s", token_hash="h", agent="a", created_at=0)
    )
    call = Call(
        call_id="c1",
        tool="t",
        display_name="T",
        kind="client",
        args={},
        response_id="r",
        deadline=1,
    )
    await store.save_call("s", call)
    call.advance(CallState.COMPLETED)
    (saved,) = await store.load_calls("s")
    assert saved.state is CallState.REQUESTED  # a copy, not the core's live object
    await store.save_call("s", call)
    other = Call(
        call_id="c2",
        tool="t",
        display_name="T",
        kind="client",
        args={},
        response_id="r",
        deadline=1,
    )
    other.advance(CallState.FAILED)
    await store.save_call("s", other)
    assert [c.call_id for c in await store.load_calls("s")] == ["c2"]  # settled calls are capped
    assert not await store.ended("s")
    await store.end_session("s")
    assert await store.ended("s")
    assert await store.get_session("s") is None
    assert await store.events_after("s", 0) is None

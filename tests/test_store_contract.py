"""One contract for every ``Store``: MemoryStore and RedisStore (on a real redis-server).

Each test runs against both; what one store does, the other does too. Limits are tiny
(5 events, 100 bytes, 3 settled calls) so the bounds show with a handful of writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Protocol

import msgspec
import pytest

from gateway.core.call import Call, CallState
from gateway.store import Lease, LeaseLost, MemoryStore, SessionRecord, Store
from tests.redis_server import RedisServer, redis_server

WAIT = 5.0
"""Seconds a test waits for a condition before it fails."""


class MakeStore(Protocol):
    def __call__(
        self, *, session_ttl: float = 60.0, lease_ttl: float = 10.0
    ) -> Awaitable[Store]: ...


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[MakeStore]:
    stores: list[Store] = []
    memory: dict[tuple[float, float], MemoryStore] = {}  # one per TTLs: "nodes" share it
    limits: dict[str, Any] = {"max_events": 5, "max_size": 100, "max_calls": 3}
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        server.flushall()

    async def make(*, session_ttl: float = 60.0, lease_ttl: float = 10.0) -> Store:
        store: Store
        if request.param == "memory":
            ttls = (session_ttl, lease_ttl)
            if ttls not in memory:
                memory[ttls] = MemoryStore(session_ttl=session_ttl, lease_ttl=lease_ttl, **limits)
            store = memory[ttls]
        else:
            from gateway.store.redis import RedisStore

            store = RedisStore.from_url(
                server.url, session_ttl=session_ttl, lease_ttl=lease_ttl, **limits
            )
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.aclose()


@pytest.fixture
async def store(make_store: MakeStore) -> Store:
    return await make_store()


def record(session_id: str = "s1") -> SessionRecord:
    return SessionRecord(
        session_id=session_id, token_hash="ab" * 32, agent="demo", created_at=1.5, principal="p"
    )


def call(call_id: str, state: CallState = CallState.REQUESTED) -> Call:
    return Call(
        call_id=call_id,
        tool="get_battery",
        display_name="Battery",
        kind="client",
        args={"unit": "%", "n": [1, 2.5]},
        response_id="r1",
        deadline=12.0,
        state=state,
        output={"level": 0.5} if state is CallState.COMPLETED else None,
    )


async def until(condition: Callable[[], Awaitable[bool]]) -> None:
    """Return once ``condition()`` holds; fail after ``WAIT`` seconds.

    For what a clock decides (a TTL running out): there is no event to wait on.
    """
    async with asyncio.timeout(WAIT):
        while not await condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def events(store: Store, after: int = 0) -> list[bytes] | None:
    return await store.events_after("s1", after)


# Records and the end of a session.


async def test_record_round_trips_and_unknown_session_is_none(store: Store):
    assert await store.get_session("s1") is None
    await store.create_session(record())
    assert await store.get_session("s1") == record()
    assert await store.get_session("s2") is None


async def test_ended_tells_an_ended_session_from_an_unknown_one(store: Store):
    await store.create_session(record())
    assert not await store.ended("s1")
    await store.end_session("s1")
    assert await store.ended("s1")
    assert not await store.ended("never")
    assert await store.get_session("s1") is None


async def test_end_session_forgets_state_log_calls_posts_and_lease(store: Store):
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=10)
    await store.commit("s1", lease, state=b"state", events=[(1, b"e1")], calls=[call("c1")])
    await store.post("s1", b"p1")
    await store.end_session("s1")
    assert await store.load_state("s1") is None
    assert await events(store) is None
    assert await store.load_calls("s1") == []
    assert await store.read_posts("s1") == []
    assert await store.owner("s1") is None
    with pytest.raises(LeaseLost):
        await store.commit("s1", lease, state=b"late", events=[])


async def test_writes_to_an_unknown_session_are_dropped(store: Store):
    await store.append_event("s1", 1, b"e1")
    await store.save_call("s1", call("c1"))
    await store.commit("s1", None, state=b"x", events=[(2, b"e2")])
    await store.post("s1", b"p")
    assert await events(store) is None
    assert await store.load_calls("s1") == []
    assert await store.load_state("s1") is None
    assert await store.read_posts("s1") == []


# The event log.


async def test_events_after_replays_in_order_from_any_seq(store: Store):
    await store.create_session(record())
    for seq in (1, 2, 3):
        await store.append_event("s1", seq, b"e%d" % seq)
    assert await events(store) == [b"e1", b"e2", b"e3"]
    assert await events(store, 2) == [b"e3"]
    assert await events(store, 3) == []
    assert await store.events_after("unknown", 0) is None


async def test_a_repeated_seq_is_logged_once(store: Store):
    await store.create_session(record())
    await store.commit("s1", None, state=None, events=[(1, b"e1"), (2, b"e2")])
    await store.commit("s1", None, state=None, events=[(2, b"again"), (3, b"e3")])
    assert await events(store) == [b"e1", b"e2", b"e3"]


async def test_the_log_keeps_max_events_and_a_replay_from_before_them_is_a_gap(store: Store):
    await store.create_session(record())
    await store.commit("s1", None, state=None, events=[(s, b"e%d" % s) for s in range(1, 8)])
    assert await events(store, 0) is None
    assert await events(store, 1) is None
    assert await events(store, 2) == [b"e3", b"e4", b"e5", b"e6", b"e7"]
    assert await events(store, 5) == [b"e6", b"e7"]


async def test_the_log_keeps_max_size_bytes(store: Store):
    await store.create_session(record())
    for seq in (1, 2, 3):
        await store.append_event("s1", seq, bytes([48 + seq]) * 40)  # 120 bytes > 100
    assert await events(store, 0) is None
    assert await events(store, 1) == [b"2" * 40, b"3" * 40]
    await store.append_event("s1", 4, b"4" * 20)  # 100 bytes: fits
    assert await events(store, 1) == [b"2" * 40, b"3" * 40, b"4" * 20]


async def test_trim_events_drops_what_the_client_acked(store: Store):
    await store.create_session(record())
    await store.commit("s1", None, state=None, events=[(s, b"e%d" % s) for s in (1, 2, 3, 4)])
    await store.trim_events("s1", 2)
    assert await events(store, 2) == [b"e3", b"e4"]
    assert await events(store, 1) is None
    await store.trim_events("s1", 0)  # nothing to drop
    await store.trim_events("s1", 2)  # again: nothing more
    assert await events(store, 2) == [b"e3", b"e4"]
    # The bytes of trimmed events no longer count: 100 more bytes fit beside e3, e4.
    await store.append_event("s1", 5, b"5" * 90)
    assert await events(store, 2) == [b"e3", b"e4", b"5" * 90]


# The call ledger.


async def test_calls_round_trip_and_reload_in_save_order(store: Store):
    await store.create_session(record())
    await store.save_call("s1", call("c1"))
    await store.save_call("s1", call("c2"))
    await store.save_call("s1", call("c1", CallState.COMPLETED))
    loaded = await store.load_calls("s1")
    assert [c.call_id for c in loaded] == ["c2", "c1"]
    assert loaded[1] == call("c1", CallState.COMPLETED)
    assert loaded[1].output == {"level": 0.5}


async def test_the_ledger_keeps_max_calls_settled_calls_and_every_open_one(store: Store):
    await store.create_session(record())
    await store.save_call("s1", call("open"))
    settled = [call(f"c{n}", CallState.COMPLETED) for n in range(5)]
    await store.commit("s1", None, state=None, events=[], calls=settled)
    assert [c.call_id for c in await store.load_calls("s1")] == ["open", "c2", "c3", "c4"]


# State and commit.


async def test_commit_saves_state_events_and_calls_together(store: Store):
    await store.create_session(record())
    assert await store.load_state("s1") is None
    lease = await store.acquire("s1", "a", ttl=10)
    await store.commit(
        "s1", lease, state=b"v1", events=[(1, b"e1"), (2, b"e2")], calls=[call("c1")]
    )
    await store.commit("s1", lease, state=None, events=[(3, b"e3")])  # no state: kept
    assert await store.load_state("s1") == b"v1"
    assert await events(store) == [b"e1", b"e2", b"e3"]
    assert [c.call_id for c in await store.load_calls("s1")] == ["c1"]


async def test_commit_under_a_stale_lease_raises_and_writes_nothing(store: Store):
    await store.create_session(record())
    old = await store.acquire("s1", "a", ttl=10)
    await store.commit("s1", old, state=b"v1", events=[(1, b"e1")], calls=[call("c1")])
    new = await store.acquire("s1", "b", ttl=10)
    assert new == Lease("b", old.fence + 1)
    with pytest.raises(LeaseLost):
        await store.commit("s1", old, state=b"stale", events=[(2, b"stale")], calls=[call("c2")])
    assert await store.load_state("s1") == b"v1"
    assert await events(store) == [b"e1"]
    assert [c.call_id for c in await store.load_calls("s1")] == ["c1"]
    await store.commit("s1", new, state=b"v2", events=[(2, b"e2")])
    assert await store.load_state("s1") == b"v2"


async def test_a_replay_read_under_a_stale_lease_raises(store: Store):
    # A node answering a resume reads the log under its lease, in one step: once another
    # node took the session over, the log may hold events this node's session never had.
    await store.create_session(record())
    old = await store.acquire("s1", "a", ttl=10)
    await store.commit("s1", old, state=b"v1", events=[(1, b"e1")])
    assert await store.events_after("s1", 0, lease=old) == [b"e1"]
    new = await store.acquire("s1", "b", ttl=10)
    with pytest.raises(LeaseLost):
        await store.events_after("s1", 0, lease=old)
    assert await store.events_after("s1", 0, lease=new) == [b"e1"]
    assert await store.events_after("s1", 0) == [b"e1"]  # unchecked


async def test_two_nodes_racing_for_a_session_exactly_one_commit_applies(
    make_store: MakeStore,
):
    node_a, node_b = await make_store(), await make_store()  # two clients, one store
    await node_a.create_session(record())
    lease_a, lease_b = await asyncio.gather(
        node_a.acquire("s1", "a", ttl=10), node_b.acquire("s1", "b", ttl=10)
    )
    assert {lease_a.fence, lease_b.fence} == {1, 2}
    outcomes = await asyncio.gather(
        node_a.commit("s1", lease_a, state=b"a", events=[(1, b"a")]),
        node_b.commit("s1", lease_b, state=b"b", events=[(1, b"b")]),
        return_exceptions=True,
    )
    winner = "a" if lease_a.fence > lease_b.fence else "b"
    assert [isinstance(o, LeaseLost) for o in outcomes] == [winner == "b", winner == "a"]
    assert await node_a.load_state("s1") == winner.encode()
    assert await node_b.events_after("s1", 0) == [winner.encode()]
    assert await node_a.owner("s1") == winner


# Leases.


async def test_acquire_takes_the_session_over_and_the_old_lease_cannot_renew(store: Store):
    await store.create_session(record())
    assert await store.owner("s1") is None
    first = await store.acquire("s1", "a", ttl=10)
    assert first == Lease("a", 1)
    assert await store.owner("s1") == "a"
    assert await store.renew("s1", first, ttl=10)
    second = await store.acquire("s1", "b", ttl=10)
    assert second == Lease("b", 2)
    assert await store.owner("s1") == "b"
    assert not await store.renew("s1", first, ttl=10)
    await store.release("s1", first)  # a lost lease releases nothing
    assert await store.owner("s1") == "b"
    await store.release("s1", second)
    assert await store.owner("s1") is None


async def test_an_expired_lease_has_no_owner_but_renews_while_no_one_took_it(store: Store):
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=0.05)

    async def unowned() -> bool:
        return await store.owner("s1") is None

    await until(unowned)
    assert await store.renew("s1", lease, ttl=10)
    assert await store.owner("s1") == "a"
    await store.commit("s1", lease, state=b"still mine", events=[])
    assert await store.load_state("s1") == b"still mine"


# Routed events.


async def test_posts_are_read_in_order_and_taken_by_the_commit_that_applied_them(store: Store):
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=10)
    for n in range(5):
        await store.post("s1", b"p%d" % n)
    assert await store.read_posts("s1") == [b"p0", b"p1", b"p2", b"p3", b"p4"]
    assert await store.read_posts("s1") == [b"p0", b"p1", b"p2", b"p3", b"p4"]  # kept
    await store.post("s1", b"p5")  # after the read: the commit leaves it
    await store.commit("s1", lease, state=b"applied", events=[], posts_taken=5)
    assert await store.read_posts("s1") == [b"p5"]


async def test_posts_read_by_a_node_that_lost_the_session_stay_for_the_owner(store: Store):
    # A node that read posts and lost the session (or died) before its commit leaves them
    # to the node that took the session over: a tool's outcome is never lost in between.
    await store.create_session(record())
    old = await store.acquire("s1", "a", ttl=10)
    await store.post("s1", b"outcome")
    assert await store.read_posts("s1") == [b"outcome"]
    new = await store.acquire("s1", "b", ttl=10)
    with pytest.raises(LeaseLost):
        await store.commit("s1", old, state=b"stale", events=[], posts_taken=1)
    assert await store.read_posts("s1") == [b"outcome"]
    await store.commit("s1", new, state=b"applied", events=[], posts_taken=1)
    assert await store.read_posts("s1") == []


async def test_posts_racing_takes_are_each_taken_exactly_once(make_store: MakeStore):
    poster, taker = await make_store(), await make_store()
    await poster.create_session(record())
    lease = await taker.acquire("s1", "a", ttl=10)
    posts = [b"p%d" % n for n in range(200)]
    taken: list[bytes] = []

    async def post_all() -> None:
        for data in posts:
            await poster.post("s1", data)

    async def take_all() -> None:
        while len(taken) < len(posts):
            read = await taker.read_posts("s1")
            await taker.commit("s1", lease, state=None, events=[], posts_taken=len(read))
            taken.extend(read)
            await asyncio.sleep(0)

    async with asyncio.timeout(WAIT * 2):
        await asyncio.gather(post_all(), take_all())
    assert taken == posts


async def test_listen_wakes_the_owning_node_only(store: Store):
    await store.create_session(record("s1"))
    await store.create_session(record("s2"))
    await store.create_session(record("s3"))
    await store.acquire("s1", "a", ttl=10)
    await store.acquire("s2", "b", ttl=10)
    woken: dict[str, list[str]] = {"a": [], "b": []}
    both = asyncio.Event()

    def waker(node: str) -> Callable[[str], None]:
        def wake(session_id: str) -> None:
            woken[node].append(session_id)
            if woken["a"] and woken["b"]:
                both.set()

        return wake

    async with store.listen("a", waker("a")), store.listen("b", waker("b")):
        await store.post("s3", b"nobody owns s3")
        await store.post("s1", b"for a")
        await store.post("s2", b"for b")
        async with asyncio.timeout(WAIT):
            await both.wait()
    # Each node's wakes arrive in order: a wake for s3, or for another node's session,
    # would have come before the one awaited.
    assert woken == {"a": ["s1"], "b": ["s2"]}
    assert await store.read_posts("s3") == [b"nobody owns s3"]


# Expiry.


async def test_every_key_of_an_unresumed_session_expires_and_it_counts_as_ended(
    make_store: MakeStore,
):
    store = await make_store(session_ttl=0.2, lease_ttl=0.1)
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=0.1)
    await store.commit("s1", lease, state=b"v", events=[(1, b"e1")], calls=[call("c1")])
    await store.post("s1", b"p")
    started = time.monotonic()

    async def gone() -> bool:
        return await store.get_session("s1") is None

    await until(gone)
    assert time.monotonic() - started > 0.2
    assert await store.ended("s1")
    assert await store.load_state("s1") is None
    assert await store.events_after("s1", 0) is None
    assert await store.load_calls("s1") == []
    assert await store.read_posts("s1") == []
    assert await store.owner("s1") is None
    with pytest.raises(LeaseLost):
        await store.commit("s1", lease, state=b"late", events=[])


async def test_renewing_the_lease_keeps_the_session(make_store: MakeStore):
    # Two sessions made together; only s1's lease is renewed. The test runs until s2, its
    # twin, has expired: s1 outlived the TTL only because of its renewals. The TTLs are ten
    # times the renew cadence, so a loaded machine that delays a renewal does not lose s1.
    store = await make_store(session_ttl=0.1, lease_ttl=0.5)  # keys live 0.6 s
    await store.create_session(record("s1"))
    await store.create_session(record("s2"))
    lease = await store.acquire("s1", "a", ttl=0.5)
    await store.acquire("s2", "a", ttl=0.5)
    async with asyncio.timeout(WAIT):
        while await store.get_session("s2") is not None:
            assert await store.renew("s1", lease, ttl=0.5)
            assert await store.get_session("s1") == record("s1")
            await asyncio.sleep(0.05)  # the renew cadence under test, not a wait for a result
    # s1's last write before the renewals came before s2's: unrenewed, it would be gone too.
    assert await store.renew("s1", lease, ttl=0.5)
    assert await store.get_session("s1") == record("s1")
    assert await store.load_state("s1") is None  # alive, and never given a state
    assert await store.owner("s2") is None


def test_lease_is_a_frozen_value():
    lease = Lease("a", 3)
    assert msgspec.json.decode(msgspec.json.encode(lease), type=Lease) == lease
    with pytest.raises(AttributeError):
        lease.fence = 4  # type: ignore[misc]


async def test_renew_many_renews_each_lease_still_held_and_reports_the_lost(store: Store):
    for session_id in ("s1", "s2", "s3"):
        await store.create_session(record(session_id))
    leases = [(sid, await store.acquire(sid, "a", ttl=10)) for sid in ("s1", "s2", "s3")]
    await store.acquire("s2", "b", ttl=10)  # another node took s2 over
    assert await store.renew_many(leases, ttl=10) == [True, False, True]
    assert await store.owner("s1") == "a"
    assert await store.owner("s2") == "b"
    assert await store.renew_many([], ttl=10) == []


async def test_the_transcript_is_kept_apart_its_oldest_items_dropped_new_ones_appended(
    store: Store,
):
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=10)
    await store.commit("s1", lease, state=b"v1", events=[], history=[b"i1", b"i2", b"i3"])
    await store.commit("s1", lease, state=b"v2", events=[], history_drop=2, history=[b"i4"])
    assert await store.load_state("s1") == b"v2"
    assert await store.load_history("s1") == [b"i3", b"i4"]
    other = await store.acquire("s1", "b", ttl=10)  # a stale lease changes nothing
    with pytest.raises(LeaseLost):
        await store.commit("s1", lease, state=b"v3", events=[], history_drop=2, history=[b"x"])
    assert await store.load_history("s1") == [b"i3", b"i4"]
    await store.commit("s1", other, state=b"v3", events=[], history_drop=5, history=[b"i9"])
    assert await store.load_history("s1") == [b"i9"]  # dropping more than is kept: all
    await store.end_session("s1")
    assert await store.load_history("s1") == []

"""What only the Redis store has: round trips, its keys' TTLs, Redis going away and back.

The contract both stores keep is in test_store_contract.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import UnixDomainSocketConnection

from gateway.config import Config
from gateway.errors import CloseCode, ConfigError, StoreUnavailable
from gateway.store import MemoryStore, SessionRecord, store_from_config
from gateway.store.redis import RedisStore, redact
from tests.redis_server import RedisServer, redis_server

SESSION_TTL, LEASE_TTL = 30.0, 5.0


@pytest.fixture
def server(tmp_path) -> Iterator[RedisServer]:
    """A server of this test's own: these tests stop and restart it."""
    with redis_server(tmp_path) as started:
        yield started


@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(server.url, session_ttl=SESSION_TTL, lease_ttl=LEASE_TTL)
    yield store
    await store.aclose()


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[Redis]:
    """A plain client, to look at the keys the store wrote."""
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


class CountingConnection(UnixDomainSocketConnection):
    """Counts what is written to Redis: one write per command, or per pipeline."""

    sends = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        await super().send_packed_command(command, check_health)


def record(session_id: str = "s1") -> SessionRecord:
    return SessionRecord(session_id=session_id, token_hash="00", agent="demo", created_at=0.0)


async def test_a_commit_of_many_events_is_one_round_trip(server: RedisServer):
    pool = ConnectionPool(connection_class=CountingConnection, path=str(server.socket))
    store = RedisStore(Redis.from_pool(pool), session_ttl=SESSION_TTL, lease_ttl=LEASE_TTL)
    try:
        await store.create_session(record())  # loads the scripts' SHA on first use
        lease = await store.acquire("s1", "a", ttl=LEASE_TTL)
        await store.commit("s1", lease, state=b"s", events=[(1, b"warm")])
        before = CountingConnection.sends
        await store.commit(
            "s1", lease, state=b"s" * 1000, events=[(s, b"d") for s in range(2, 202)]
        )
        assert CountingConnection.sends - before == 1
        assert len(await store.events_after("s1", 0) or []) == 201
    finally:
        await store.aclose()


async def test_every_key_of_a_session_has_a_ttl_and_renew_resets_it(store: RedisStore, raw: Redis):
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=LEASE_TTL)
    await store.commit("s1", lease, state=b"s", events=[(1, b"e1")])
    await store.post("s1", b"p")
    keys = sorted(await raw.keys("gw:{s1}:*"))
    assert [k.decode().rsplit(":", 1)[1] for k in keys] == sorted(
        ["record", "state", "fence", "owner", "log", "meta", "inbox", "known"]
    )
    ttls = {k.decode().rsplit(":", 1)[1]: await raw.pttl(k) for k in keys}
    full = (SESSION_TTL + LEASE_TTL) * 1000
    assert 0 < ttls.pop("owner") <= LEASE_TTL * 1000
    assert 86_000_000 < ttls.pop("known") <= 86_400_000  # outlives the rest: "ended"
    assert all(full - 5_000 < ttl <= full for ttl in ttls.values()), ttls
    await raw.pexpire("gw:{s1}:state", 1_000)
    assert await store.renew("s1", lease, ttl=LEASE_TTL)
    assert await raw.pttl("gw:{s1}:state") > full - 5_000
    await store.end_session("s1")
    assert await raw.keys("gw:{s1}:*") == [b"gw:{s1}:known"]


async def test_a_down_redis_raises_store_unavailable_and_the_store_recovers_after_restart(
    store: RedisStore, server: RedisServer
):
    await store.create_session(record())
    lease = await store.acquire("s1", "a", ttl=LEASE_TTL)
    await store.commit("s1", lease, state=b"before", events=[(1, b"e1")])
    server.stop()
    for attempt in (
        store.ping(),
        store.get_session("s1"),
        store.commit("s1", lease, state=b"during", events=[(2, b"e2")]),
        store.read_posts("s1"),
    ):
        with pytest.raises(StoreUnavailable) as caught:
            await attempt
        assert str(server.socket) in str(caught.value)
    assert caught.value.code == "store_unavailable"
    assert caught.value.close_code is CloseCode.TRY_AGAIN
    assert caught.value.retryable
    server.start()  # empty: Redis kept nothing on disk
    await store.ping()
    assert await store.get_session("s1") is None
    await store.create_session(record())
    lease = await store.acquire("s1", "b", ttl=LEASE_TTL)
    await store.commit("s1", lease, state=b"after", events=[(1, b"e1")])
    assert await store.load_state("s1") == b"after"


async def test_listen_resubscribes_after_a_restart(store: RedisStore, server: RedisServer):
    woken: asyncio.Queue[str] = asyncio.Queue()
    async with store.listen("a", woken.put_nowait):
        await store.create_session(record())
        await store.acquire("s1", "a", ttl=LEASE_TTL)
        await store.post("s1", b"before")
        async with asyncio.timeout(5):
            assert await woken.get() == "s1"
        server.restart()
        await store.create_session(record())
        await store.acquire("s1", "a", ttl=LEASE_TTL)
        # The listener resubscribes on its own after a backoff; post until a wake comes.
        async with asyncio.timeout(10):
            while woken.empty():
                await store.post("s1", b"after")
                try:
                    async with asyncio.timeout(0.2):
                        await woken.get()
                    break
                except TimeoutError:
                    continue
    assert len(await store.read_posts("s1")) >= 1


async def test_errors_name_the_url_without_its_password(tmp_path):
    url = f"unix://:hunter2@{tmp_path}/nothing-here.sock"
    store = RedisStore.from_url(url, session_ttl=1, lease_ttl=1)
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await store.ping()
    finally:
        await store.aclose()
    assert "nothing-here.sock" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert redact("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact("redis://host:6379/0") == "redis://host:6379/0"


async def test_store_from_config_builds_the_named_store(server: RedisServer):
    assert isinstance(store_from_config(Config()), MemoryStore)
    store = store_from_config(Config(store=server.url, session_ttl=5, lease_ttl=1))
    assert isinstance(store, RedisStore)
    try:
        await store.ping()
    finally:
        await store.aclose()
    for bad in ("redis", "http://cache:6379", "postgres://x"):
        with pytest.raises(ConfigError, match="store: expected 'memory' or a redis://"):
            store_from_config(Config(store=bad))
    with pytest.raises(ConfigError, match="not a valid redis:// URL"):
        store_from_config(Config(store="redis://host:notaport/0"))


def test_serve_refuses_a_store_that_is_not_a_redis_url(capsys):
    from gateway.__main__ import main

    assert main(["serve", "--port", "0", "--no-auth", "--store", "mysql://db/x"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: store: expected 'memory' or a redis://" in err
    assert "got a mysql:// URL" in err

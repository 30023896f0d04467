"""Named values of the ``Store`` (``put_named``, ``get_named``): on MemoryStore and on
RedisStore over a real redis-server. What A2A keeps for any node: a context's session, a
task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.errors import StoreUnavailable
from gateway.store import MemoryStore, Store
from gateway.store.redis import RedisStore
from tests.redis_server import RedisServer

WAIT = 5.0
"""Seconds a test waits for a condition before it fails."""


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    made: Store
    if request.param == "memory":
        made = MemoryStore()
    else:
        server: RedisServer = request.getfixturevalue("redis")
        made = RedisStore.from_url(server.url, session_ttl=60, lease_ttl=10)
    yield made
    await made.aclose()


async def gone(store: Store, name: str) -> None:
    """Return once ``name`` has no value (its TTL ran out), polling the store."""
    async with asyncio.timeout(WAIT):
        # Expiry is no event: the store's clock (Redis's) is polled, under the deadline.
        while await store.get_named(name) is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_a_value_is_kept_under_its_name_and_replaced(store: Store) -> None:
    assert await store.get_named("a2a:context:c1") is None
    await store.put_named("a2a:context:c1", b"first", ttl=60)
    await store.put_named("a2a:context:c2", b"\x00\xffbinary", ttl=60)
    assert await store.get_named("a2a:context:c1") == b"first"
    assert await store.get_named("a2a:context:c2") == b"\x00\xffbinary"
    await store.put_named("a2a:context:c1", b"second", ttl=60)
    assert await store.get_named("a2a:context:c1") == b"second"
    assert await store.get_named("a2a:context:c3") is None


async def test_a_value_goes_when_its_ttl_runs_out(store: Store) -> None:
    await store.put_named("short", b"brief", ttl=0.3)
    await store.put_named("long", b"stays", ttl=60)
    assert await store.get_named("short") == b"brief"
    await gone(store, "short")
    assert await store.get_named("long") == b"stays"


async def test_a_put_again_sets_a_new_ttl(store: Store) -> None:
    await store.put_named("name", b"old", ttl=0.3)
    await store.put_named("name", b"new", ttl=60)  # the short TTL no longer holds
    await store.put_named("marker", b"m", ttl=0.3)
    await gone(store, "marker")  # past the first put's TTL
    assert await store.get_named("name") == b"new"
    await store.put_named("name", b"newer", ttl=0.3)  # nor does the long one
    await gone(store, "name")


async def test_named_values_are_not_sessions(store: Store) -> None:
    await store.put_named("s1", b"value", ttl=60)
    assert await store.get_session("s1") is None
    assert not await store.ended("s1")


async def test_the_redis_keys_carry_the_prefix_and_a_ttl(redis: RedisServer) -> None:
    store = RedisStore.from_url(redis.url, session_ttl=60, lease_ttl=10, prefix="app:")
    try:
        await store.put_named("a2a:task:x", b"v", ttl=30)
        assert await store.client.get("app:named:a2a:task:x") == b"v"
        assert 0 < await store.client.pttl("app:named:a2a:task:x") <= 30_000
    finally:
        await store.aclose()


async def test_a_redis_that_does_not_answer_raises_store_unavailable(tmp_path: Path) -> None:
    socket = tmp_path / "nothing-here.sock"
    store = RedisStore.from_url(f"unix://{socket}", session_ttl=60, lease_ttl=10)
    try:
        with pytest.raises(StoreUnavailable, match=r"nothing-here\.sock"):
            await store.put_named("a", b"v", ttl=1)
        with pytest.raises(StoreUnavailable, match=r"nothing-here\.sock"):
            await store.get_named("a")
    finally:
        await store.aclose()


async def test_a_redis_that_stops_answering_raises_then_serves_again(
    redis: RedisServer,
) -> None:
    store = RedisStore.from_url(redis.url, session_ttl=60, lease_ttl=10)
    try:
        await store.put_named("a", b"v", ttl=60)
        redis.stop()
        with pytest.raises(StoreUnavailable) as caught:
            await store.get_named("a")
        assert caught.value.code == "store_unavailable"
        with pytest.raises(StoreUnavailable):
            await store.put_named("a", b"w", ttl=60)
        redis.start()  # empty: it kept nothing on disk
        assert await store.get_named("a") is None
        await store.put_named("a", b"w", ttl=60)
        assert await store.get_named("a") == b"w"
    finally:
        await store.aclose()

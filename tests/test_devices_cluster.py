"""Two devices on one session across three gateway processes on one redis-server, behind the
shipped nginx config (routing by session): the phone joins the laptop's session through
nginx, and every socket of the session ends up on one node, whichever node the session
started on. The shipped Python SDK on both devices."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from client_sdk import connect
from gateway.wire.v1 import Error, ResponseDone, TextDelta, ToolCalls
from tests.cluster import Cluster, behind_nginx, owner, owners_store, running_cluster
from tests.redis_server import RedisServer
from tests.support import record

pytestmark = pytest.mark.slow  # processes and nginx

WAIT = 20.0


def done(events: list[Any]) -> int:
    return sum(isinstance(e, ResponseDone) for e in events)


def text(events: list[Any]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextDelta))


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path, redis.url) as nodes:
        yield nodes


async def test_two_devices_share_a_session_through_nginx_routing_by_session(
    cluster: Cluster, redis: RedisServer, tmp_path: Path
) -> None:
    runs: list[str] = []
    async with (
        behind_nginx(cluster, tmp_path, sticky=True) as url,
        owners_store(redis.url) as store,
        connect(url, max_reconnect_delay=0.2) as laptop,
    ):
        created = await laptop.start()
        async with connect(
            url, join=(created.session_id, created.resume_token), max_reconnect_delay=0.2
        ) as phone:

            @phone.client_function("device")
            async def device(tag: str) -> dict[str, Any]:
                runs.append(tag)
                return {"value": f"phone:{tag}"}

            await phone.start()
            laptop_seen, phone_seen = record(laptop), record(phone)
            for turn in range(3):
                async with asyncio.timeout(WAIT):
                    said = "".join([d async for d in laptop.say(f"ask t{turn}")])
                assert said == f"asking device said phone:t{turn}"
            assert runs == ["t0", "t1", "t2"]
            # Every event reached both devices: their sockets are on the node driving it.
            node = await owner(store, laptop)
            for other in cluster.nodes:
                if other.name != node:
                    assert await other.metric("gateway_sockets_attached") == 0.0
            await laptop_seen.until(lambda events: done(events) == 3)
            await phone_seen.until(lambda events: text(events) == text(laptop_seen.events))
            laptop_calls = [
                c for e in laptop_seen.events if isinstance(e, ToolCalls) for c in e.calls
            ]
            assert laptop_calls == []  # the calls went to the phone only
            for seen in (laptop_seen, phone_seen):
                assert not [e for e in seen.events if isinstance(e, Error)]
                numbers = [e.seq for e in seen.events if e.seq]
                assert numbers == sorted(set(numbers))
                seen.stop()

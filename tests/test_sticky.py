"""Sticky routing by session: the SDKs name the session in the URL of every socket that
resumes it (``?session=<session_id>``), the gateway ignores that parameter, and the shipped
deploy/nginx.conf routes /v1/realtime by a consistent hash of it.

The routing tests run three real ``gateway serve`` processes on one redis-server
(tests/cluster.py) behind Debian's nginx (tests/nginx.py), driven by the shipped Python SDK.
Correctness never depends on the routing: rendered without the hash (``sticky=False``) the
same resumes move between nodes, and the conversation goes on all the same.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from client_sdk import Conversation, connect, connect_raw
from client_sdk.connection import open_socket, resume_url
from gateway.store.redis import RedisStore
from gateway.wire.v1 import SessionCreated, SessionResume, SessionResumed, SessionStart
from tests.cluster import Cluster, adoptions, owner, owners_store, running_cluster
from tests.nginx import nginx_in_front
from tests.proxy import Proxy, proxy_to
from tests.redis_server import RedisServer
from tests.support import Gateway, serving
from tests.test_auth import AUTH, mint

WAIT = 20.0
"""Seconds any one step may take (a resume through nginx on a busy 2-core machine)."""
SESSIONS = 4
"""Sessions in the sticky test: on every node, and not a multiple of their number, so that
round robin would send the resumes of a session's rounds to other nodes."""
RESUMES = 3
"""Resumes per session after its first one, each of which must stay on its node."""


# ----------------------------------------------------------------------- the SDK's URLs


def test_resume_url_adds_the_session_and_keeps_the_query_as_written() -> None:
    url = "ws://gw.test/v1/realtime"
    assert resume_url(url, "sess_1") == f"{url}?session=sess_1"
    assert resume_url(f"{url}?token=a%2Bb.c", "sess_1") == f"{url}?token=a%2Bb.c&session=sess_1"
    # An old one is replaced, never repeated; a name that only looks alike is kept.
    assert resume_url(f"{url}?session=old&x=1&session=older", "s2") == f"{url}?x=1&session=s2"
    assert resume_url(f"{url}?sess%69on=old&sessions=2", "s3") == f"{url}?sessions=2&session=s3"
    assert resume_url(f"{url}?", "a b/&c") == f"{url}?session=a%20b%2F%26c"


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    # With auth: a token in the URL's query must still be read beside ``session``.
    async with serving(**AUTH, first_message_timeout=60) as running:
        yield running


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[Proxy]:
    async with proxy_to(gateway.port) as running:
        yield running


@pytest.fixture
def dialed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URL of every socket the SDK opens from now on (it still opens them)."""
    urls: list[str] = []
    real = open_socket

    async def recording(url: str, **kwargs: Any) -> ClientConnection:
        urls.append(url)
        return await real(url, **kwargs)

    monkeypatch.setattr("client_sdk.client.open_socket", recording)
    return urls


def cut(conv: Conversation) -> None:
    """Drop the SDK's socket the hard way (no close frame), as a phone losing signal."""
    assert conv._ws is not None
    conv._ws.transport.abort()


async def resume_after_cut(conv: Conversation, drop: Callable[[], None] | None = None) -> None:
    """Cut the SDK's socket (or ``drop()`` it some other way) and wait until the SDK has
    delivered ``session.resumed``."""
    events = conv.events()  # subscribed before the drop: the answer cannot be missed
    if drop is None:
        cut(conv)
    else:
        drop()
    try:
        async with asyncio.timeout(WAIT):
            async for event in events:
                if isinstance(event, SessionResumed):
                    return
    finally:
        await events.aclose()


async def say(conv: Conversation, text: str) -> str:
    async with asyncio.timeout(WAIT):
        return "".join([delta async for delta in conv.say(text)])


async def test_every_socket_resuming_a_session_names_it_and_the_gateway_serves_it(
    gateway: Gateway, proxy: Proxy, dialed: list[str]
) -> None:
    token = await mint(gateway)
    start_url = f"{proxy.url()}?token={token}"  # a token in the query (not the SDK's way)
    async with connect(start_url) as conv:
        session = await conv.start()
        assert await say(conv, "echo before") == "before"
        await resume_after_cut(conv)  # the gateway reads the token beside ``session``
        assert await say(conv, "echo after") == "after"
        # close() while a resume waits for its upgrade: it ends the session with an HTTP
        # DELETE, no socket (docs/mobile.md).
        proxy.upgrades = ["hold"]
        cut(conv)
        await proxy.wait_until(lambda: proxy.held == 1)
    async with asyncio.timeout(5):
        await gateway.runtime.idle.wait()  # the DELETE ended the session
    assert await gateway.runtime.store.ended(session.session_id)
    resuming = f"{start_url}&session={session.session_id}"
    assert dialed == [start_url, resuming, resuming]
    assert conv.reconnects == 1


async def test_the_gateway_ignores_the_session_parameter_on_both_endpoints(
    gateway: Gateway,
) -> None:
    token = await mint(gateway)
    # A start with a stale one starts a new session.
    async with connect_raw(f"{gateway.url}?session=sess_stale&token={token}") as conn:
        await conn.send(SessionStart())
        created = await conn.recv()
        assert isinstance(created, SessionCreated)
        assert created.session_id != "sess_stale"
        conn.websocket.transport.abort()  # dropped: the session waits for its resume
    # The session resumed is the one session.resume names, whatever the URL says.
    url = f"{gateway.url}?session=sess_someone_else&token={token}"
    async with connect_raw(url) as conn:
        resume = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=1
        )
        await conn.send(resume)
        resumed = await conn.recv()
        assert isinstance(resumed, SessionResumed)
        assert resumed.session_id == created.session_id
    # The OpenAI-compatible endpoint has no resume; the parameter changes nothing there.
    openai_url = gateway.url.replace("/v1/realtime", "/v1/openai/realtime")
    async with websockets.connect(
        f"{openai_url}?session=sess_x&token={token}",
        subprotocols=["realtime"],  # type: ignore[list-item]
    ) as socket:
        first = json.loads(await asyncio.wait_for(socket.recv(), WAIT))
    assert first["type"] == "session.created"
    assert first["session"]["id"] != "sess_x"


# ----------------------------------------------------------------------- through nginx


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path, redis.url) as nodes:
        yield nodes


@pytest.fixture
async def owners(redis: RedisServer) -> AsyncIterator[RedisStore]:
    async with owners_store(redis.url) as store:
        yield store


async def open_sessions(stack: AsyncExitStack, url: str, count: int) -> list[Conversation]:
    """``count`` conversations through ``url``, one after the other, each with one turn."""
    convs = []
    for i in range(count):
        conv = await stack.enter_async_context(connect(url))
        assert await say(conv, f"echo hello {i}") == f"hello {i}"
        convs.append(conv)
    return convs


async def test_sticky_nginx_spreads_new_sessions_and_keeps_each_resume_on_its_node(
    cluster: Cluster, owners: RedisStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "nginx"
    run_dir.mkdir()
    async with nginx_in_front(cluster.ports, run_dir) as port, AsyncExitStack() as stack:
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        convs = await open_sessions(stack, url, SESSIONS)
        # New sessions (no ``session`` parameter: an empty key) go round robin.
        started = Counter([await owner(owners, conv) for conv in convs])
        assert set(started) == {node.name for node in cluster.nodes}, started
        # The first resume goes to the session's node on the hash ring, where round robin
        # may not have started it: it may move, once.
        for conv in convs:
            await resume_after_cut(conv)
        homes = [await owner(owners, conv) for conv in convs]
        adopted = await adoptions(cluster)
        # Every resume after that lands on the node that drives the session: no adoption.
        for round_ in range(RESUMES):
            for conv, home in zip(convs, homes, strict=True):
                await resume_after_cut(conv)
                assert await owner(owners, conv) == home
                assert await say(conv, f"echo r{round_}") == f"r{round_}"
        assert await adoptions(cluster) == adopted
        assert [conv.reconnects for conv in convs] == [1 + RESUMES] * SESSIONS

        # Its node killed, a session resumes on another one (the next on the ring), and
        # stays there while the dead node is left out.
        conv, home = convs[0], homes[0]
        await resume_after_cut(conv, cluster.node(home).kill)
        refuge = await owner(owners, conv)
        assert refuge != home
        assert await say(conv, "echo elsewhere") == "elsewhere"
        await resume_after_cut(conv)
        assert await owner(owners, conv) == refuge


async def test_without_stickiness_resumes_move_and_the_conversation_goes_on(
    cluster: Cluster, owners: RedisStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "nginx"
    run_dir.mkdir()
    async with (
        nginx_in_front(cluster.ports, run_dir, sticky=False) as port,
        AsyncExitStack() as stack,
    ):
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        convs = await open_sessions(stack, url, 2)
        moves = 0
        for round_ in range(RESUMES):
            for conv in convs:
                before = await owner(owners, conv)
                await resume_after_cut(conv)
                moves += await owner(owners, conv) != before
                assert await say(conv, f"echo r{round_}") == f"r{round_}"
        # One socket at a time through one nginx worker, in strict rotation over the three
        # nodes: a session's socket comes two after its previous one, on another node.
        assert moves == len(convs) * RESUMES
        assert await adoptions(cluster) == moves

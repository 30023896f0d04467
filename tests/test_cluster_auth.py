"""Authentication across nodes: three ``gateway serve`` processes with auth on (API keys,
one ``--token-secret``) on one redis-server, behind the shipped deploy/nginx.conf rendered
round robin (tests/cluster.py, tests/nginx.py).

What docs/security.md promises of several nodes: they share ``token_secret``, so a client
token minted on one serves on every one; a session resumes on any node, but only for its
principal (the one that created it), whoever holds its resume token; and a token signed
with another secret is refused everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from client_sdk import Conversation, connect, connect_raw
from gateway.auth.credentials import TokenIssuer, TokenRequest
from gateway.store.redis import RedisStore
from gateway.wire.v1 import SessionCreated, SessionResume, SessionResumed, SessionStart
from tests.cluster import Cluster, Node, behind_nginx, owner, owners_store
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # three processes, redis-server and nginx: seconds to start

KEY = "backend-key-0123456789abcdef"
OTHER_KEY = "other-key-0123456789abcdef"
SECRET = "cluster-token-secret-0123456789abcdef"
AGENT = "cluster"
"""The agent of tests/data/cluster_agent.toml: a token is bound to it."""
WAIT = 20.0
"""Seconds any one step may take (a resume through nginx on a busy 2-core machine)."""
MAX_CUTS = 3
"""Cuts until the session has resumed on another node: round robin over three nodes moves
it at the first one (one socket at a time through one nginx worker); the bound is slack."""


@pytest.fixture
async def cluster(redis: RedisServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# name:key\nbackend:{KEY}\nother:{OTHER_KEY}\n")
    auth = ["--api-keys-file", str(keys), "--token-secret", SECRET]
    nodes = Cluster(tmp_path, redis.url, auth=auth)
    try:
        await nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
async def owners(redis: RedisServer) -> AsyncIterator[RedisStore]:
    async with owners_store(redis.url) as store:
        yield store


def ws_url(node: Node) -> str:
    return f"ws://127.0.0.1:{node.port}/v1/realtime"


async def mint(node: Node, user: str, key: str = KEY) -> str:
    """A client token for end user ``user``, from ``POST /v1/sessions`` on ``node``."""
    async with httpx.AsyncClient(base_url=node.url, trust_env=False, timeout=WAIT) as http:
        response = await http.post(
            "/v1/sessions", json={"user": {"id": user}}, headers={"authorization": f"Bearer {key}"}
        )
    assert response.status_code == 201, response.text
    assert response.json()["agent"] == AGENT
    token: str = response.json()["token"]
    return token


async def _answer(url: str, first: Any, **credential: str) -> Any:
    async with connect_raw(url, **credential) as conn:
        await conn.send(first)
        return await asyncio.wait_for(conn.recv(), WAIT)


async def refusal(url: str, first: Any, **credential: str) -> tuple[int, str]:
    """The close code and reason of a socket that sends ``first`` with ``credential``."""
    with pytest.raises(websockets.ConnectionClosed) as caught:
        await _answer(url, first, **credential)
    assert caught.value.rcvd is not None, caught.value
    return caught.value.rcvd.code, caught.value.rcvd.reason


async def say(conv: Conversation, text: str) -> str:
    async with asyncio.timeout(WAIT):
        return "".join([delta async for delta in conv.say(text)])


async def resume_after_cut(conv: Conversation) -> None:
    """Cut the SDK's socket the hard way (no close frame) and wait for its resume."""
    events = conv.events()  # subscribed before the cut: the answer cannot be missed
    assert conv._ws is not None
    conv._ws.transport.abort()
    try:
        async with asyncio.timeout(WAIT):
            async for event in events:
                if isinstance(event, SessionResumed):
                    return
    finally:
        await events.aclose()


async def test_a_token_from_one_node_serves_on_all_and_only_its_principal_resumes_the_session(
    cluster: Cluster, owners: RedisStore, tmp_path: Path
) -> None:
    first, second, _ = cluster.nodes
    alice = await mint(first, "alice")
    # The nodes share the secret: the token minted on one node opens a session on each.
    for node in cluster.nodes:
        created = await _answer(ws_url(node), SessionStart(), token=alice)
        assert isinstance(created, SessionCreated), (node.name, created)

    async with (
        behind_nginx(cluster, tmp_path, sticky=False) as url,
        connect(url, token=alice) as conv,
    ):
        assert await say(conv, "echo before the cut") == "before the cut"
        assert conv.session is not None
        session = conv.session
        home = await owner(owners, conv)
        # Cut and resumed through round robin, with the same token, on another node.
        for _ in range(MAX_CUTS):
            await resume_after_cut(conv)
            if await owner(owners, conv) != home:
                break
        moved_to = await owner(owners, conv)
        assert moved_to != home
        assert await say(conv, "echo after the move") == "after the move"
        reconnects = conv.reconnects

        # Another principal holding the session's id and resume token is refused on every
        # node, the one that drives it included: another end user of the same backend, and
        # another API key.
        mallory = await mint(second, "mallory")
        resume = SessionResume(
            session_id=session.session_id, resume_token=session.resume_token, last_seq=0
        )
        not_owner = (4001, "not the session's owner")
        for node in cluster.nodes:
            assert await refusal(ws_url(node), resume, token=mallory) == not_owner, node.name
            assert await refusal(ws_url(node), resume, api_key=OTHER_KEY) == not_owner, node.name

        # A token signed with another secret, claiming to be alice's, is refused everywhere,
        # for a resume as for a start.
        forger = TokenIssuer(b"another-secret-0123456789abcdef!", ttl=600, max_ttl=600)
        forged = forger.mint(
            "backend", TokenRequest(user={"id": "alice"}), agent=AGENT, now=time.time()
        ).token
        bad_signature = (4001, "bad signature")
        for node in cluster.nodes:
            assert await refusal(ws_url(node), resume, token=forged) == bad_signature, node.name
            assert await refusal(ws_url(node), SessionStart(), token=forged) == bad_signature
        assert await refusal(url, SessionStart(), token=forged) == bad_signature  # via nginx

        # None of it disturbed the session: it goes on, on its node, on its socket.
        assert await say(conv, "echo still mine") == "still mine"
        assert await owner(owners, conv) == moved_to
        assert conv.reconnects == reconnects
    assert [node.alive for node in cluster.nodes] == [True] * 3

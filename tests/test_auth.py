"""Authentication from outside, over real sockets, with auth on: API keys, client tokens
(POST /v1/sessions), the principal of a session, Origin and Host allow-lists."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import structlog
import websockets

from client_sdk import connect, connect_raw
from client_sdk.connection import Connection
from gateway.auth.api_key import parse_api_keys
from gateway.auth.credentials import AuthError, TokenIssuer, TokenRequest, TokenRequestError
from gateway.errors import ConfigError
from gateway.wire.v1 import (
    Error,
    Outbound,
    ResponseDone,
    SessionCreated,
    SessionResume,
    SessionResumed,
    SessionStart,
    SessionUpdate,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolSpec,
    UserMessage,
    encode,
)
from tests.support import Gateway, say, serving, streamed_text

KEY = "backend-key-0123456789abcdef"
OTHER_KEY = "other-key-0123456789abcdef"
SECRET = "s" * 40
AUTH: dict[str, Any] = {
    "no_auth": False,
    "api_keys": f"backend:{KEY},other:{OTHER_KEY}",
    "token_secret": SECRET,
}
ISSUER = TokenIssuer(SECRET.encode(), ttl=600, max_ttl=3600)


@asynccontextmanager
async def gateway(**overrides: Any) -> AsyncIterator[Gateway]:
    async with serving(**{**AUTH, **overrides}) as gw:
        yield gw


def http_base(gw: Gateway) -> str:
    return gw.url.replace("ws://", "http://").removesuffix("/v1/realtime")


async def mint(gw: Gateway, key: str = KEY, **body: Any) -> str:
    async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client:
        response = await client.post(
            "/v1/sessions", json=body, headers={"authorization": f"Bearer {key}"}
        )
    assert response.status_code == 201, response.text
    answer = response.json()
    assert answer["url"] == gw.url
    assert answer["agent"] == "test"
    token: str = answer["token"]
    return token


async def _first_answer(url: str, first: Any, **kwargs: Any) -> Outbound:
    async with connect_raw(url, **kwargs) as conn:
        await conn.send(first)
        return await conn.recv()


async def refused(url: str, first: Any = None, **kwargs: Any) -> websockets.ConnectionClosed:
    """Connect, send ``first`` (``session.start``), return how the gateway closed the socket."""
    with pytest.raises(websockets.ConnectionClosed) as caught:
        await _first_answer(url, first or SessionStart(), **kwargs)
    return caught.value


def close_of(exc: websockets.ConnectionClosed) -> tuple[int, str]:
    assert exc.rcvd is not None
    return exc.rcvd.code, exc.rcvd.reason


async def start(conn: Connection, **fields: Any) -> SessionCreated:
    await conn.send(SessionStart(**fields))
    created = await conn.recv()
    assert isinstance(created, SessionCreated), created
    return created


# ----------------------------------------------------------------------------- sockets


async def test_a_socket_without_a_credential_closes_4001():
    async with gateway() as gw:
        code, reason = close_of(await refused(gw.url))
    assert code == 4001
    assert "required" in reason


async def test_an_expired_token_closes_4001():
    async with gateway() as gw:
        old = ISSUER.mint("backend", TokenRequest(), agent="test", now=time.time() - 601)
        assert close_of(await refused(gw.url, token=old.token)) == (4001, "token expired")


async def test_a_forged_token_closes_4001():
    forger = TokenIssuer(b"x" * 40, ttl=600, max_ttl=600)
    forged = forger.mint("backend", TokenRequest(), agent="test", now=time.time()).token
    async with gateway() as gw:
        genuine = await mint(gw)
        header, _, signature = genuine.split(".")
        tampered = f"{header}.{forged.split('.')[1]}.{signature}"
        assert close_of(await refused(gw.url, token=forged)) == (4001, "bad signature")
        assert close_of(await refused(gw.url, token=tampered)) == (4001, "bad signature")
        assert close_of(await refused(gw.url, token="not-a-token")) == (4001, "malformed token")


async def test_a_token_for_another_agent_closes_4001():
    other = ISSUER.mint("backend", TokenRequest(), agent="billing", now=time.time())
    async with gateway() as gw:
        code, reason = close_of(await refused(gw.url, token=other.token))
    assert (code, reason) == (4001, "token is for agent 'billing'")


async def test_a_token_bound_to_another_origin_closes_4001():
    app, other = "https://app.example.com", "https://other.example.com"
    async with gateway(allowed_origins=f"{app},{other}") as gw:
        token = await mint(gw, origin=app)
        code, reason = close_of(await refused(gw.url, token=token, origin=other))
        assert (code, reason) == (4001, "token is bound to origin 'https://app.example.com'")
        async with connect_raw(gw.url, token=token, origin=app) as conn:
            await start(conn)


async def test_an_origin_not_allowed_closes_4003_and_gets_403_over_http():
    async with gateway(allowed_origins="https://app.example.com") as gw:
        token = await mint(gw)
        code, reason = close_of(await refused(gw.url, token=token, origin="https://evil.example"))
        assert code == 4003
        assert "https://evil.example" in reason
        # Same-origin pages (the gateway's own demo) are always allowed.
        own = http_base(gw)
        async with connect_raw(gw.url, token=token, origin=own) as conn:
            await start(conn)
        async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client:
            response = await client.get(
                "/v1/tools",
                headers={"origin": "https://evil.example", "authorization": f"Bearer {KEY}"},
            )
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden_origin"


async def test_a_foreign_host_is_refused_at_the_handshake_and_gets_400_over_http():
    async with gateway() as gw:
        port = int(gw.url.split(":")[2].split("/")[0])
        rebound = f"ws://attacker.example:{port}/v1/realtime"
        with pytest.raises(websockets.InvalidStatus) as caught:
            async with connect_raw(rebound, api_key=KEY, host="127.0.0.1", port=port, proxy=None):
                pass
        assert caught.value.response.status_code == 403
        async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client:
            rebound_host = {"host": f"attacker.example:{port}", "authorization": f"Bearer {KEY}"}
            response = await client.get("/v1/tools", headers=rebound_host)
            assert response.status_code == 400
            assert response.json()["code"] == "bad_host"
            # Health probes come with any Host (a container's, a pod's IP).
            assert (await client.get("/healthz", headers=rebound_host)).status_code == 200


async def test_an_api_key_as_bearer_holds_a_conversation_server_to_server():
    async with gateway() as gw:
        async with connect_raw(gw.url, api_key=KEY) as conn:
            created = await start(conn)
            events = await say(conn, "echo hi")
            record = await gw.runtime.store.get_session(created.session_id)
        assert streamed_text(events) == "hi"
        assert close_of(await refused(gw.url, api_key="wrong-key-0123456789"))[0] == 4001
    assert record is not None
    assert record.principal == "key:backend"


async def test_a_token_in_the_query_string_is_accepted_and_never_echoed():
    async with gateway() as gw:
        token = await mint(gw)
        async with connect_raw(f"{gw.url}?token={token}") as conn:
            await start(conn)
        async with connect_raw(gw.url, token=token) as conn:
            # The server selects gateway.v1: the token is never echoed back.
            assert conn.websocket.subprotocol == "gateway.v1"
            assert token not in str(conn.websocket.response.headers)


# ----------------------------------------------------------------------------- HTTP


async def test_post_sessions_needs_a_valid_key_and_a_valid_body():
    async with (
        gateway() as gw,
        httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client,
    ):
        missing = await client.post("/v1/sessions", json={})
        wrong = await client.post(
            "/v1/sessions", json={}, headers={"authorization": "Bearer nope-0123456789abcdef"}
        )
        auth = {"authorization": f"Bearer {KEY}"}
        unknown_field = await client.post("/v1/sessions", json={"agnet": "x"}, headers=auth)
        too_long = await client.post("/v1/sessions", json={"expires_in": 7200}, headers=auth)
        not_json = await client.post("/v1/sessions", content=b"{", headers=auth)
        huge = await client.post("/v1/sessions", content=b" " * (65 * 1024), headers=auth)
        big_claims = await client.post(
            "/v1/sessions", json={"user": {"id": "1", "bio": "x" * 5000}}, headers=auth
        )
    assert missing.status_code == wrong.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert wrong.json() == {"error": "unknown API key", "code": "unauthorized"}
    assert unknown_field.status_code == 422
    assert "agnet" in unknown_field.json()["error"]
    assert too_long.status_code == 422
    assert "3600" in too_long.json()["error"]
    assert not_json.status_code == 400
    assert huge.status_code == 413
    assert big_claims.status_code == 422


async def test_dev_token_is_404_with_auth_on_and_works_under_no_auth():
    async with (
        gateway() as gw,
        httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client,
    ):
        assert (await client.post("/v1/dev/token")).status_code == 404
    async with (
        serving(no_auth=True, token_secret=SECRET) as gw,
        httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client,
    ):
        response = await client.post("/v1/dev/token")
        assert response.status_code == 201
        async with connect_raw(gw.url, token=response.json()["token"]) as conn:
            created = await start(conn)
            record = await gw.runtime.store.get_session(created.session_id)
        assert record is not None
        assert record.principal == "key:dev"
        # Presented tokens are checked even without auth.
        assert close_of(await refused(gw.url, token="x.y.z"))[0] == 4001


async def test_tool_endpoints_need_a_key_or_a_token():
    async with (
        gateway() as gw,
        httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as client,
    ):
        token = await mint(gw)
        body = {"a": 1, "b": 2}
        no_key = await client.post("/v1/tools/add/test", json=body)
        with_token = await client.post(
            "/v1/tools/add/test", json=body, headers={"authorization": f"Bearer {token}"}
        )
        with_key = await client.post(
            "/v1/tools/add/test", json=body, headers={"authorization": f"Bearer {KEY}"}
        )
        list_anonymous = await client.get("/v1/tools")
        list_with_token = await client.get(
            "/v1/tools", headers={"authorization": f"Bearer {token}"}
        )
    assert no_key.status_code == with_token.status_code == 401
    assert with_key.status_code == 200
    assert with_key.json()["output"] == {"total": 3}
    assert list_anonymous.status_code == 401
    assert list_with_token.status_code == 200


# ----------------------------------------------------------------------------- principal


async def test_a_token_from_post_sessions_drives_a_whole_conversation_with_the_sdk():
    async with gateway() as gw:
        token = await mint(gw, user={"id": 42, "scopes": ["orders:read"], "tier": "gold"})
        async with connect(gw.url, token=token) as conv:
            created = await conv.start()
            first = "".join([d async for d in conv.say("echo hello")])
            second = "".join([d async for d in conv.say("echo again")])
            driver = gw.runtime.drivers[created.session_id]
            principal = driver.session.principal
    assert (first, second) == ("hello", "again")
    assert principal.name == "key:backend/user:42"
    assert principal.kind == "client_token"
    assert principal.user_id == "42"
    assert principal.scopes == ("orders:read",)
    assert principal.claims == {"tier": "gold"}


async def test_the_sdk_resumes_with_a_fresh_token_from_its_token_function():
    async with gateway() as gw:
        minted: list[str] = []

        async def fresh_token() -> str:
            minted.append(await mint(gw, user={"id": "42"}))
            return minted[-1]

        async with connect(gw.url, token=fresh_token) as conv:
            created = await conv.start()
            assert "".join([d async for d in conv.say("echo one")]) == "one"
            server_side = gw.runtime.drivers[created.session_id].connection
            assert server_side is not None
            server_side.close(1013, "cut by the test")  # the SDK resumes
            assert "".join([d async for d in conv.say("echo two")]) == "two"
            assert conv.reconnects == 1
    assert len(set(minted)) == 2  # one token per connect


async def test_a_resume_needs_the_principal_that_created_the_session():
    async with gateway() as gw:
        token = await mint(gw, user={"id": "42"})
        async with connect_raw(gw.url, token=token) as conn:
            created = await start(conn)
            await conn.websocket.close(code=4000)  # a drop: the session waits for a resume
        resume = SessionResume(
            session_id=created.session_id, resume_token=created.resume_token, last_seq=1
        )
        stranger = await mint(gw, user={"id": "43"})
        closed = await refused(gw.url, resume, token=stranger)
        assert close_of(closed) == (4001, "not the session's owner")
        # A fresh token of the same user (the first one may have expired) resumes it.
        async with connect_raw(gw.url, token=await mint(gw, user={"id": "42"})) as conn:
            await conn.send(resume)
            assert isinstance(await conn.recv(), SessionResumed)


async def test_sessions_are_isolated_from_each_other():
    async with gateway() as gw:
        token_a = await mint(gw, user={"id": "a"})
        token_b = await mint(gw, user={"id": "b"})
        async with (
            connect_raw(gw.url, token=token_a) as a,
            connect_raw(gw.url, token=token_b) as b,
        ):
            created_a = await start(a)
            created_b = await start(b)
            await a.send(UserMessage(text="one"))
            events_a = await a.recv_until(lambda e: isinstance(e, ToolCalls))
            calls = events_a[-1]
            assert isinstance(calls, ToolCalls)
            call_id = calls.calls[0].call_id
            # B answers A's call: B has no such call.
            stolen = ToolResult(call_id=call_id, tool="device_a", output={"value": "x"})
            await b.send(ToolResults(results=[stolen], id="r1"))
            error = await b.recv()
            assert isinstance(error, Error)
            assert error.code == "unknown_call"
            events_b = await say(b, "echo b only")  # the error only echoed B's own input
            # A's call is still open and A's conversation goes on.
            await a.send(ToolResults(results=[stolen]))
            events_a += await a.recv_until(lambda e: isinstance(e, ResponseDone))
            # A's session id with B's resume token: refused, for B's principal and for A's.
            hijack = SessionResume(
                session_id=created_a.session_id, resume_token=created_b.resume_token, last_seq=0
            )
            as_b = close_of(await refused(gw.url, hijack, token=token_b))
            as_a = close_of(await refused(gw.url, hijack, token=token_a))
            assert as_b == (4001, "not the session's owner")
            assert as_a == (4001, "wrong resume token")
        assert not _mentions(events_b, created_a.session_id, call_id, *_ids(events_a))
        assert streamed_text(events_a).endswith("A=x")  # A got its own call answered, once


def _ids(events: list[Outbound]) -> set[str]:
    return {
        value
        for e in events
        for name in ("response_id", "call_id", "session_id")
        if isinstance(value := getattr(e, name, None), str)
    }


def _mentions(events: list[Outbound], *needles: str) -> list[str]:
    return [n for e in events for n in needles if n and n in encode(e).decode()]


async def test_a_client_function_the_token_does_not_allow_is_forbidden():
    spec = ToolSpec(name="open_door", description="Opens the front door.")
    allowed = ToolSpec(name="read_gauge", description="Reads the gauge.")
    async with gateway() as gw:
        token = await mint(gw, client_functions=["read_gauge"])
        async with connect_raw(gw.url, token=token) as conn:
            await conn.send(SessionStart(client_functions=[spec, allowed], id="s1"))
            error = await conn.recv()
            assert isinstance(error, Error)
            assert (error.code, error.in_reply_to) == ("forbidden", "s1")
            assert "open_door" in error.message
            created = await start(conn, client_functions=[allowed])
            assert "read_gauge" in {t.name for t in created.tools}
            # The socket is alive: a declaration by session.update is refused the same way.
            await conn.send(SessionUpdate(client_functions=[spec], id="u1"))
            error = await conn.recv()
            assert isinstance(error, Error)
            assert (error.code, error.in_reply_to) == ("forbidden", "u1")


async def test_keys_and_tokens_never_reach_the_logs():
    async with gateway() as gw:
        with structlog.testing.capture_logs() as logs:
            token = await mint(gw)
            async with connect_raw(gw.url, token=token) as conn:
                await start(conn)
            await refused(gw.url, token=token + "x")
            await refused(gw.url, api_key=KEY + "x")
            await asyncio.sleep(0)  # let the server's last log lines land
    text = repr(logs)
    assert "client_token_issued" in text
    assert "connection_refused" in text
    assert KEY not in text
    assert token.split(".")[2] not in text


# ----------------------------------------------------------------------------- pure parts


def test_token_expiry_is_checked_against_the_given_time():
    minted = ISSUER.mint("backend", TokenRequest(expires_in=60), agent="test", now=1000.0)
    assert minted.expires_at == 1060.0
    principal = ISSUER.verify(minted.token, now=1059.0, agent="test", origin=None)
    assert principal.name == "key:backend"
    with pytest.raises(AuthError, match="token expired"):
        ISSUER.verify(minted.token, now=1060.0, agent="test", origin=None)


def test_token_requests_are_bounded():
    with pytest.raises(TokenRequestError, match="expires_in"):
        ISSUER.mint("k", TokenRequest(expires_in=3601), agent="test", now=0)
    with pytest.raises(TokenRequestError, match="origin"):
        ISSUER.mint("k", TokenRequest(origin="https://a.example/path"), agent="test", now=0)
    with pytest.raises(TokenRequestError, match=r"user\.id"):
        ISSUER.mint("k", TokenRequest(user={"scopes": []}), agent="test", now=0)
    with pytest.raises(ConfigError, match="32 bytes"):
        TokenIssuer(b"short", ttl=1, max_ttl=1)


def test_bad_api_key_entries_are_named_without_the_key():
    with pytest.raises(ConfigError) as caught:
        parse_api_keys(["# comment", "", "backend:tooshort-secret"], "keys.txt")
    assert "entry 3" in str(caught.value)
    assert "tooshort" not in str(caught.value)
    assert parse_api_keys(["a:0123456789abcdef"], "env").keys() == {"a"}

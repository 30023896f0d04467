"""``--no-auth`` (what ``make run`` uses) and the credentials clients send anyway.

OpenAI's SDKs always send a key (``Authorization: Bearer sk-...``, or in a browser the
``openai-insecure-api-key.<key>`` subprotocol). Under ``--no-auth`` a bearer credential that
is neither a key nor a valid token of the gateway is ignored: the caller is ``anonymous``,
and the gateway says so once (``credential_ignored``). With auth on it is refused (4001, 401).
A valid credential keeps its principal, and a token offered as one (the
``gateway.token.<t>`` subprotocol, ``?token=``) is still checked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import websockets
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection

from client_sdk import connect, connect_raw
from gateway.wire.v1 import SessionCreated, SessionStart
from tests.cluster import Node
from tests.support import Gateway, serving

NEWCOMER_KEY = "sk-proj-N3wc0merKeyFromTheOpenAIDashboard0123456789"
"""What a newcomer's ``OPENAI_API_KEY`` looks like: the SDK sends it, unknown to the gateway."""
GATEWAY_KEY = "backend-key-0123456789abcdef"
SECRET = "s" * 40
WAIT = 20.0
"""Seconds any one step may take (a gateway process starting on a busy 2-core machine)."""


def user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def first_turn(conn: AsyncRealtimeConnection, text: str) -> list[Any]:
    """``session.created``, then a user message and ``response.create``: every event up to
    ``response.done``."""
    events: list[Any] = []
    async with asyncio.timeout(WAIT):
        events.append(await conn.recv())
        await conn.conversation.item.create(item=user_item(text))  # type: ignore[arg-type]
        await conn.response.create()
        while events[-1].type != "response.done":
            events.append(await conn.recv())
    return events


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def ignored(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [line for line in logs if line.get("event") == "credential_ignored"]


# ------------------------------------------------------------------ what make run serves


@pytest.fixture
async def make_run(tmp_path: Path) -> AsyncIterator[Node]:
    """``gateway serve --no-auth`` as ``make run`` starts it (the demo agent), as a process
    whose log is read whole once it has stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    node = Node("dev", tmp_path, ["--no-auth", "--scripted-pace", "0"], env)
    node.start()
    try:
        await node.wait_ready()
        yield node
    finally:
        node.stop()


async def stopped_log(node: Node) -> list[dict[str, Any]]:
    """Stop ``node`` gracefully (SIGTERM) and return its JSON log lines."""
    assert node.proc is not None
    node.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(node.proc.wait, WAIT) == 0, node.tail()
    lines = node.log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


async def test_the_openai_sdk_works_at_the_first_try_against_make_run_and_is_warned_once(
    make_run: Node,
) -> None:
    base = f"ws://127.0.0.1:{make_run.port}"
    client = AsyncOpenAI(api_key=NEWCOMER_KEY, websocket_base_url=f"{base}/v1/openai")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        first = await first_turn(conn, "hello")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        second = await first_turn(conn, "hello again")
    # The gateway's own SDK with the same key, and the HTTP API.
    async with connect(f"{base}/v1/realtime", api_key=NEWCOMER_KEY) as conv:
        async with asyncio.timeout(WAIT):
            v1_text = "".join([delta async for delta in conv.say("hello")])
    headers = {"authorization": f"Bearer {NEWCOMER_KEY}"}
    async with httpx.AsyncClient(base_url=make_run.url, trust_env=False, timeout=WAIT) as http:
        tools = await http.get("/v1/tools", headers=headers)
        stock = await http.post(
            "/v1/tools/check_stock/test", json={"product": "headphones"}, headers=headers
        )
    logs = await stopped_log(make_run)

    for events in (first, second):
        assert events[0].type == "session.created"
        assert events[-1].response.status == "completed"
        assert text_of(events).startswith("Hello!")
    assert v1_text.startswith("Hello!")
    assert tools.status_code == 200
    assert stock.status_code == 200, stock.text
    (warning,) = ignored(logs)  # four ignored credentials, one warning
    assert warning["level"] == "warning"
    assert warning["label"] == "bad_key"
    attached = [line for line in logs if line.get("event") == "socket_attached"]
    assert [line["principal"] for line in attached] == ["anonymous"] * 3
    assert NEWCOMER_KEY not in make_run.log.read_text()  # never logged


# ------------------------------------------------------------------ in process


def http_base(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.port}"


async def openai_socket_closed_with(gw: Gateway, key: str) -> websockets.ConnectionClosed:
    url = f"ws://127.0.0.1:{gw.port}/v1/openai/realtime"
    with pytest.raises(websockets.ConnectionClosed) as caught:
        async with websockets.connect(
            url,
            subprotocols=["realtime"],  # type: ignore[list-item]
            additional_headers={"Authorization": f"Bearer {key}"},
        ) as socket:
            await asyncio.wait_for(socket.recv(), WAIT)
    return caught.value


async def _first_answer(url: str, **credential: str) -> object:
    async with connect_raw(url, **credential) as conn:
        await conn.send(SessionStart())
        return await asyncio.wait_for(conn.recv(), WAIT)


async def v1_socket_closed_with(gw: Gateway, **credential: str) -> websockets.ConnectionClosed:
    with pytest.raises(websockets.ConnectionClosed) as caught:
        await _first_answer(gw.url, **credential)
    return caught.value


def close_of(exc: websockets.ConnectionClosed) -> tuple[int, str]:
    assert exc.rcvd is not None
    return exc.rcvd.code, exc.rcvd.reason


async def test_with_auth_on_a_credential_that_is_no_key_is_still_refused() -> None:
    auth: dict[str, Any] = {
        "no_auth": False,
        "api_keys": f"backend:{GATEWAY_KEY}",
        "token_secret": SECRET,
    }
    with structlog.testing.capture_logs() as logs:
        async with serving(**auth) as gw:
            v1 = close_of(await v1_socket_closed_with(gw, api_key=NEWCOMER_KEY))
            openai = close_of(await openai_socket_closed_with(gw, NEWCOMER_KEY))
            headers = {"authorization": f"Bearer {NEWCOMER_KEY}"}
            async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as http:
                tools = await http.get("/v1/tools", headers=headers)
                tool_test = await http.post("/v1/tools/add/test", json={"a": 1}, headers=headers)
    assert v1 == openai == (4001, "unknown API key")
    assert tools.status_code == tool_test.status_code == 401
    assert not ignored(logs)


async def principal_of(gw: Gateway, **credential: str) -> str:
    async with connect_raw(gw.url, **credential) as conn:
        await conn.send(SessionStart())
        created = await asyncio.wait_for(conn.recv(), WAIT)
        assert isinstance(created, SessionCreated), created
        record = await gw.runtime.store.get_session(created.session_id)  # while it lives
    assert record is not None
    return record.principal


async def test_under_no_auth_valid_credentials_count_and_tokens_offered_as_tokens_are_checked() -> (
    None
):
    with structlog.testing.capture_logs() as logs:
        async with serving(no_auth=True, token_secret=SECRET) as gw:
            async with httpx.AsyncClient(base_url=http_base(gw), trust_env=False) as http:
                minted = await http.post("/v1/dev/token")
                token = minted.json()["token"]
                # A bearer that does not hold is ignored on HTTP too, once for the process.
                headers = {"authorization": f"Bearer {NEWCOMER_KEY}"}
                tools = await http.get("/v1/tools", headers=headers)
                tool_test = await http.post("/v1/tools/add/test", json={"a": 1}, headers=headers)
            anonymous = await principal_of(gw, api_key=NEWCOMER_KEY)
            forged_bearer = await principal_of(gw, api_key="x.y.z")  # token-shaped, not one
            as_bearer = await principal_of(gw, api_key=token)
            as_token = await principal_of(gw, token=token)
            forged = close_of(await v1_socket_closed_with(gw, token="x.y.z"))
    assert minted.status_code == 201
    assert tools.status_code == 200
    assert tool_test.status_code == 422  # past the guard: the tool's input is checked
    assert anonymous == forged_bearer == "anonymous"
    assert as_bearer == as_token == "key:dev"
    assert forged[0] == 4001
    (warning,) = ignored(logs)
    assert warning["log_level"] == "warning"
    assert warning["label"] == "bad_key"

"""Debian's nginx, with the shipped deploy/nginx.conf, in front of a real gateway
(the machinery is in ``tests/nginx.py``): a conversation on each WebSocket endpoint, the
gateway's own (``/v1/realtime``) and the OpenAI-compatible one (``/v1/openai/realtime``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import structlog
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from starlette.routing import WebSocketRoute

from client_sdk import connect, connect_raw
from gateway.config import Config
from gateway.edge.app import create_app
from gateway.wire.v1 import SessionResumed, SessionStart, ToolCalls
from tests.nginx import TEMPLATE, nginx_in_front, render
from tests.support import TEST_AGENT, serving

DEPLOY_DOC = Path(__file__).parents[1] / "docs" / "deploy.md"
WAIT = 20.0
"""Seconds any one step may take through nginx on a busy 2-core machine."""
KEY = "0123456789abcdef0123"
"""An API key of the gateway: OpenAI's SDKs always send one (``Authorization: Bearer``)."""
NGINX_TIMEOUT = 60.0
"""nginx's default ``proxy_read_timeout`` and ``proxy_send_timeout``, in seconds."""


async def test_a_conversation_with_a_client_function_and_a_resume_through_nginx(
    tmp_path: Path,
) -> None:
    async with serving() as gateway:
        gateway_port = int(gateway.url.split(":")[2].split("/")[0])
        async with nginx_in_front(gateway_port, tmp_path) as port:
            release = asyncio.Event()
            runs = 0
            async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as conv:

                @conv.client_function("device_a")
                async def device_a() -> dict[str, str]:
                    nonlocal runs
                    runs += 1
                    await release.wait()
                    return {"value": "via nginx"}

                session = await conv.start()
                assert "hello" == "".join([d async for d in conv.say("echo hello")])

                async def cut_then_release() -> None:
                    async for event in conv.events():
                        if isinstance(event, ToolCalls):
                            # The gateway drops the socket; the SDK resumes through nginx.
                            driver = gateway.runtime.drivers[session.session_id]
                            assert driver.connection is not None
                            driver.connection.close(1013, "cut by the test")
                        elif isinstance(event, SessionResumed):
                            release.set()  # the result goes out on the new socket
                            return

                helper = asyncio.create_task(cut_then_release())
                text = "".join([d async for d in conv.say("one")])
                await asyncio.wait_for(helper, 5)
                assert conv.reconnects == 1

            async with httpx.AsyncClient() as client:
                health = await client.get(f"http://127.0.0.1:{port}/healthz")
                hidden = await client.get(f"http://127.0.0.1:{port}/metrics")
                direct = await client.get(f"http://127.0.0.1:{gateway_port}/metrics")
    assert text == "calling A A=via nginx"  # say() joins model steps with a space
    assert runs == 1
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert hidden.status_code == 404  # not exposed through the public proxy
    assert direct.status_code == 200
    assert "gateway_socket_attaches_total" in direct.text
    assert 'gateway_socket_attaches_total{kind="resume"} 1.0' in direct.text


async def client_address_seen(url: str, forwarded_for: str) -> str:
    """The client address the gateway logs for a socket that claims ``forwarded_for``."""
    with structlog.testing.capture_logs() as logs:
        async with connect_raw(url, additional_headers={"X-Forwarded-For": forwarded_for}) as conn:
            await conn.send(SessionStart())
            await conn.recv()
    (attached,) = [line for line in logs if line["event"] == "socket_attached"]
    return str(attached["client"])


async def test_a_forged_forwarded_for_does_not_pass_nginx(tmp_path: Path) -> None:
    async with serving() as gateway:
        gateway_port = int(gateway.url.split(":")[2].split("/")[0])
        # The gateway believes the proxies it trusts (forwarded_allow_ips: 127.0.0.1)...
        direct = await client_address_seen(gateway.url, "203.0.113.9")
        async with nginx_in_front(gateway_port, tmp_path) as port:
            # ...and nginx, the edge, replaces what a client claims with its real address.
            proxied = await client_address_seen(f"ws://127.0.0.1:{port}/v1/realtime", "203.0.113.9")
    assert "203.0.113.9" in direct
    assert "203.0.113.9" not in proxied
    assert "127.0.0.1" in proxied


def test_the_deploy_doc_shows_the_tested_config() -> None:
    """docs/deploy.md quotes deploy/nginx.conf as is, so the doc cannot drift."""
    assert TEMPLATE.read_text().strip() in DEPLOY_DOC.read_text()


# ----------------------------------------------------------------- the OpenAI endpoint


async def answer(conn: AsyncRealtimeConnection, text: str) -> list[Any]:
    """A user message item and ``response.create``; the events up to ``response.done``."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
    await conn.response.create()
    return await events_until(conn, "response.done")


async def events_until(conn: AsyncRealtimeConnection, kind: str) -> list[Any]:
    events: list[Any] = []
    async with asyncio.timeout(WAIT):
        while not events or events[-1].type != kind:
            events.append(await conn.recv())
    return events


def text_of(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def test_a_conversation_with_a_function_call_on_the_openai_endpoint_through_nginx(
    tmp_path: Path,
) -> None:
    # As docs/openai-compat.md tells TLS users: OpenAI's SDK pointed at nginx.
    async with (
        serving(no_auth=False, api_keys=f"app:{KEY}", scripted_pace=0.0) as gateway,
        nginx_in_front(gateway.port, tmp_path) as port,
    ):
        client = AsyncOpenAI(api_key=KEY, websocket_base_url=f"ws://127.0.0.1:{port}/v1/openai")
        async with client.realtime.connect(model="gpt-realtime") as conn:
            created = await events_until(conn, "session.created")
            assert created[-1].session.model == "gpt-realtime"
            first = await answer(conn, "echo hello through nginx")
            assert text_of(first) == "hello through nginx"
            tool: dict[str, Any] = {
                "type": "function",
                "name": "device_a",
                "description": "Client function A.",
                "parameters": {"type": "object", "properties": {}},
            }
            settings = {"type": "realtime", "output_modalities": ["text"], "tools": [tool]}
            await conn.session.update(session=settings)  # type: ignore[arg-type]
            await events_until(conn, "session.updated")
            asked = await answer(conn, "one")
            (call,) = [e for e in asked if e.type == "response.function_call_arguments.done"]
            assert call.name == "device_a"
            output = {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"value": "via nginx"}',
            }
            await conn.conversation.item.create(item=output)  # type: ignore[arg-type]
            await conn.response.create()
            after = await events_until(conn, "response.done")
    assert [e.response.status for e in (first[-1], asked[-1], after[-1])] == ["completed"] * 3
    assert text_of(after) == "A=via nginx"
    assert not [e for e in first + asked + after if e.type == "error"]


# ----------------------------------------------------------------- every WebSocket path


def locations(config: str) -> list[tuple[str, str, str]]:
    """The ``location`` blocks of the config: (modifier, pattern, body), in order. The
    shipped file nests no block in a location."""
    found = re.findall(
        r"^\s*location\s+(?:(=|~\*?|\^~)\s+)?(\S+)\s*\{(.*?)^\s*\}", config, re.M | re.S
    )
    return [(modifier, pattern, body) for modifier, pattern, body in found]


def location_for(config: str, path: str) -> str:
    """The body of the location nginx picks for ``path``: an exact match, else the
    longest prefix unless a regex matches first (in the file's order), as nginx does."""
    blocks = locations(config)
    for modifier, pattern, body in blocks:
        if modifier == "=" and pattern == path:
            return body
    prefixes = [(p, m, b) for m, p, b in blocks if m in ("", "^~") and path.startswith(p)]
    longest = max(prefixes, key=lambda found: len(found[0]), default=None)
    if longest is None or longest[1] != "^~":
        for modifier, pattern, body in blocks:
            flags = re.I if modifier == "~*" else 0
            if modifier.startswith("~") and re.search(pattern, path, flags):
                return body
    assert longest is not None, f"no location of the config serves {path}"
    return longest[2]


def directive(body: str, name: str) -> list[str]:
    return re.findall(rf"^\s*{name}\s+([^;]*);", body, re.M)


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m|h)?", value)
    assert match is not None, value
    unit = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]
    return int(match.group(1)) * unit


def test_every_websocket_path_of_the_gateway_is_proxied_as_a_websocket_with_long_timeouts() -> None:
    """Each path the app serves a WebSocket on reaches, through the shipped file, a location
    that passes the upgrade on and outlasts a quiet session (the gateway pings every
    ``ws_ping_interval``); plain HTTP is never half upgraded."""
    app = create_app(Config(host="127.0.0.1", no_auth=True, agent=str(TEST_AGENT)))
    paths = [route.path for route in app.routes if isinstance(route, WebSocketRoute)]
    assert {"/v1/realtime", "/v1/openai/realtime"} <= set(paths)
    ping = Config().ws_ping_interval
    assert ping is not None
    config = render(["127.0.0.1:8000", "127.0.0.1:8001"], "8080")
    for path in paths:
        body = location_for(config, path)
        assert directive(body, "proxy_http_version") == ["1.1"], path
        headers = directive(body, "proxy_set_header")
        assert "Upgrade $http_upgrade" in headers, path
        assert "Connection $gateway_connection" in headers, path
        for timeout in ("proxy_read_timeout", "proxy_send_timeout"):
            (value,) = directive(body, timeout) or [f"{NGINX_TIMEOUT:g}s"]
            assert seconds(value) >= 3 * ping, (path, timeout, value)
        assert directive(body, "proxy_buffering") == ["off"], path
    plain = location_for(config, "/v1/tools")
    assert 'Connection ""' in directive(plain, "proxy_set_header")
    assert not [h for h in directive(plain, "proxy_set_header") if h.startswith("Upgrade")]
    assert location_for(config, "/v1/realtimes") == plain  # the pattern is anchored
    assert directive(location_for(config, "/metrics"), "return") == ["404"]

"""Debian's nginx, with the shipped deploy/nginx.conf, in front of a real gateway
(the machinery is in ``tests/nginx.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import structlog

from client_sdk import connect, connect_raw
from gateway.protocol import SessionResumed, SessionStart, ToolCalls
from tests.nginx import TEMPLATE, nginx_in_front
from tests.support import serving

DEPLOY_DOC = Path(__file__).parents[1] / "docs" / "deploy.md"


async def test_a_conversation_with_a_client_function_and_a_resume_through_nginx(
    tmp_path: Path,
):
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


async def test_a_forged_forwarded_for_does_not_pass_nginx(tmp_path: Path):
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


def test_the_deploy_doc_shows_the_tested_config():
    """docs/deploy.md quotes deploy/nginx.conf as is, so the doc cannot drift."""
    assert TEMPLATE.read_text().strip() in DEPLOY_DOC.read_text()

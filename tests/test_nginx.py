"""Debian's nginx, with the shipped deploy/nginx.conf, in front of a real gateway.

nginx runs in the foreground with everything (pid, logs, temp files) in a temporary
directory. Its listening socket is bound by the test on a port the kernel picks and
handed over the way nginx hands sockets to a new binary (the ``NGINX`` environment
variable): clients queue in the backlog from the start, so there is no port race and
no waiting for nginx to come up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import structlog

from client_sdk import connect, connect_raw
from gateway.protocol import SessionResumed, SessionStart, ToolCalls
from tests.support import serving

ROOT = Path(__file__).parents[1]
NGINX = Path("/usr/sbin/nginx")
TEMPLATE = ROOT / "deploy" / "nginx.conf"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"


def nginx_binary() -> str:
    # Never skipped: `make test` installs Debian's nginx when it is missing.
    assert NGINX.exists(), f"{NGINX} is missing: `make test` installs it (apt-get install nginx)"
    return str(NGINX)


def render(upstream: str, listen: str) -> str:
    """deploy/nginx.conf with its placeholders filled in."""
    text = TEMPLATE.read_text()
    assert "{{upstream}}" in text
    assert "{{listen}}" in text
    return text.replace("{{upstream}}", upstream).replace("{{listen}}", listen)


def main_config(run_dir: Path, site: Path) -> str:
    """A whole nginx.conf around the site: nothing outside ``run_dir`` is written."""
    return f"""
daemon off;
worker_processes 1;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log notice;
events {{ worker_connections 64; }}
http {{
    access_log {run_dir}/access.log;
    client_body_temp_path {run_dir}/client_body;
    proxy_temp_path {run_dir}/proxy;
    fastcgi_temp_path {run_dir}/fastcgi;
    uwsgi_temp_path {run_dir}/uwsgi;
    scgi_temp_path {run_dir}/scgi;
    include {site};
}}
"""


@contextmanager
def listening_socket() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.set_inheritable(True)
        yield sock
    finally:
        sock.close()


@asynccontextmanager
async def nginx_in_front(gateway_port: int, run_dir: Path) -> AsyncIterator[int]:
    """nginx proxying to the gateway; yields the port nginx listens on."""
    with listening_socket() as sock:
        port = sock.getsockname()[1]
        site = run_dir / "gateway.conf"
        site.write_text(render(f"127.0.0.1:{gateway_port}", f"127.0.0.1:{port}"))
        conf = run_dir / "nginx.conf"
        conf.write_text(main_config(run_dir, site))
        proc = await asyncio.create_subprocess_exec(
            nginx_binary(),
            "-p",
            str(run_dir),
            "-e",
            str(run_dir / "error.log"),
            "-c",
            str(conf),
            pass_fds=[sock.fileno()],
            env={**os.environ, "NGINX": f"{sock.fileno()};"},  # inherit the bound socket
            stdout=subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            yield port
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGQUIT)  # graceful: finish requests, then exit
            async with asyncio.timeout(10):
                _, stderr = await proc.communicate()
            log = (run_dir / "error.log").read_text()
            assert proc.returncode == 0, (stderr.decode(), log)
            assert "using inherited sockets" in log  # the socket the test bound, no race


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
    assert text == "calling AA=via nginx"
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

"""Debian's nginx, with the shipped deploy/nginx.conf, in front of real gateways.

The shipped file routes /v1/realtime by a consistent hash of the ``session`` query parameter
(sticky resumes); ``sticky=False`` renders it without that line, plain round robin, for tests
whose resumes must move between nodes.

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
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

__all__ = [
    "STICKY_LINE",
    "TEMPLATE",
    "listening_socket",
    "main_config",
    "nginx_binary",
    "nginx_in_front",
    "render",
]

ROOT = Path(__file__).parents[1]
NGINX = Path("/usr/sbin/nginx")
TEMPLATE = ROOT / "deploy" / "nginx.conf"
_SERVER_LINE = "    server {{upstream}};\n"
_UPSTREAMS = 2
"""Upstream blocks in the file, each with one ``server`` line to repeat per node: round robin
for HTTP, hashed by session for /v1/realtime."""
STICKY_LINE = "    hash $arg_session consistent;\n"
"""The line that makes /v1/realtime's upstream sticky by session (``render(sticky=False)``
leaves it out: round robin)."""


def nginx_binary() -> str:
    # Never skipped: `make test` installs Debian's nginx when it is missing.
    assert NGINX.exists(), f"{NGINX} is missing: `make test` installs it (apt-get install nginx)"
    return str(NGINX)


def render(upstreams: Sequence[str], listen: str, *, sticky: bool = True) -> str:
    """deploy/nginx.conf with its placeholders filled in: in each upstream block its
    ``server`` line once per upstream (as the file's header tells operators to do for
    several nodes). ``sticky=False``: without the hash by session, so /v1/realtime is round
    robin too."""
    text = TEMPLATE.read_text()
    assert text.count(_SERVER_LINE) == _UPSTREAMS
    assert text.count(STICKY_LINE) == 1
    assert "{{listen}}" in text
    if not sticky:
        text = text.replace(STICKY_LINE, "")
    servers = "".join(_SERVER_LINE.replace("{{upstream}}", u) for u in upstreams)
    return text.replace(_SERVER_LINE, servers).replace("{{listen}}", listen)


def main_config(run_dir: Path, site: Path, *, worker_connections: int = 64) -> str:
    """A whole nginx.conf around the site: nothing outside ``run_dir`` is written."""
    return f"""
daemon off;
worker_processes 1;
worker_shutdown_timeout 3s;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log notice;
events {{ worker_connections {worker_connections}; }}
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
def listening_socket(backlog: int = 64) -> Iterator[socket.socket]:
    """A TCP socket on 127.0.0.1 and a port the kernel picks, listening and inheritable."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(backlog)
        sock.set_inheritable(True)
        yield sock
    finally:
        sock.close()


@asynccontextmanager
async def nginx_in_front(
    gateway_ports: int | Sequence[int],
    run_dir: Path,
    *,
    worker_connections: int = 64,
    sticky: bool = True,
) -> AsyncIterator[int]:
    """nginx proxying to the gateways; yields the port nginx listens on.

    With ``sticky`` (the shipped file) /v1/realtime is routed by a consistent hash of the
    ``session`` query parameter (round robin without one); ``sticky=False`` routes it round
    robin. HTTP requests go round robin either way.
    """
    ports = [gateway_ports] if isinstance(gateway_ports, int) else list(gateway_ports)
    with listening_socket(backlog=max(64, worker_connections)) as sock:
        port = sock.getsockname()[1]
        site = run_dir / "gateway.conf"
        upstreams = [f"127.0.0.1:{p}" for p in ports]
        site.write_text(render(upstreams, f"127.0.0.1:{port}", sticky=sticky))
        conf = run_dir / "nginx.conf"
        conf.write_text(main_config(run_dir, site, worker_connections=worker_connections))
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
                # Graceful: finish requests, then exit; WebSockets still open (a gateway node
                # keeps a session's upstream socket until it closes it) are closed after
                # worker_shutdown_timeout.
                proc.send_signal(signal.SIGQUIT)
            async with asyncio.timeout(10):
                _, stderr = await proc.communicate()
            log = (run_dir / "error.log").read_text()
            assert proc.returncode == 0, (stderr.decode(), log)
            assert "using inherited sockets" in log  # the socket the test bound, no race

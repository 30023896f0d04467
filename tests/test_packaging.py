"""The wheel: it carries the web demo and the browser SDK, and the gateway serves them
from the installed packages (``importlib.resources``), not from a source tree."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).parents[1]

SHIPPED = {
    # every file of the page, its ES modules included (a missing one breaks the page)
    *(f"web_demo/{path.name}" for path in (ROOT / "web_demo").iterdir() if path.is_file()),
    "client_sdk/js/gateway-client.js",
    "client_sdk/js/protocol.schema.json",
    "gateway/demo/agent.toml",
    "gateway/demo/scenario.toml",
    "gateway/demo/billing.toml",
    "gateway/demo/billing_scenario.toml",
}

# Serves the app from wherever ``gateway`` is imported, on a port the kernel picks.
_SERVE = """
import asyncio, json, socket
import gateway, web_demo
from gateway.__main__ import build_server
from gateway.edge.app import create_app
from gateway.config import Config
from gateway.logging import configure_logging

configure_logging("warning")  # logs on stderr, as `gateway serve` has them; stdout is ours
config = Config(port=0)
server = build_server(config, create_app(config))
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(16)
print(json.dumps({"port": sock.getsockname()[1], "gateway": gateway.__file__,
                  "web_demo": web_demo.__file__}), flush=True)
asyncio.run(server.serve(sockets=[sock]))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-c", f"import hatchling.build as b; b.build_wheel({str(out)!r})"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_carries_the_web_demo_and_the_browser_sdk(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert names >= SHIPPED, SHIPPED - names
    assert not [name for name in names if name.endswith(".test.js")]  # tests stay home


async def test_the_installed_wheel_serves_the_demo_and_the_sdk(wheel: Path, tmp_path: Path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # installing a pure wheel is unpacking it
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    # The installed copy comes first on the path; the source tree is not on it (the cwd
    # is elsewhere), so only the wheel's files can be served.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SERVE,
        cwd=elsewhere,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "GATEWAY_LOG_LEVEL": "warning"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            started = json.loads(await proc.stdout.readline())
        assert Path(started["gateway"]).is_relative_to(site)
        assert Path(started["web_demo"]).is_relative_to(site)
        base = f"http://127.0.0.1:{started['port']}"
        async with httpx.AsyncClient(base_url=base) as client:
            for path, source in [
                ("/", "web_demo/index.html"),
                ("/demo/demo.js", "web_demo/demo.js"),
                ("/demo/style.css", "web_demo/style.css"),
                ("/sdk/gateway-client.js", "client_sdk/js/gateway-client.js"),
            ]:
                response = await client.get(path)
                assert response.status_code == 200, path
                assert response.content == (ROOT / source).read_bytes(), path
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.communicate()

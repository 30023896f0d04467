"""The Dockerfile, as far as it can be checked without a Docker daemon: its health check
command really probes a gateway, and the image runs the gateway, unprivileged."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from pathlib import Path

from tests.support import serving

DOCKERFILE = (Path(__file__).parents[1] / "Dockerfile").read_text()


def instruction(name: str) -> str:
    """The last ``name`` instruction of the final stage, continuation lines joined."""
    joined = DOCKERFILE.replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.*)$", joined, flags=re.MULTILINE)
    assert found, name
    return str(found[-1])


def healthcheck_command() -> list[str]:
    command = instruction("HEALTHCHECK").split(" CMD ", 1)[1]
    argv = json.loads(command)
    assert isinstance(argv, list)
    return [str(arg) for arg in argv]


async def run_healthcheck(port: int) -> int:
    argv = healthcheck_command()
    assert argv[0] == "python"  # the slim image has no curl
    proc = await asyncio.create_subprocess_exec(
        "python3", *argv[1:], env={**os.environ, "GATEWAY_PORT": str(port)}
    )
    async with asyncio.timeout(20):
        return await proc.wait()


async def test_the_healthcheck_passes_on_a_live_gateway_and_fails_without_one():
    async with serving() as gateway:
        port = int(gateway.url.split(":")[2].split("/")[0])
        assert await run_healthcheck(port) == 0
    with socket.socket() as bound_not_listening:  # connections to it are refused
        bound_not_listening.bind(("127.0.0.1", 0))
        assert await run_healthcheck(bound_not_listening.getsockname()[1]) != 0


def test_the_image_serves_on_all_interfaces_as_an_unprivileged_user():
    assert json.loads(instruction("CMD")) == ["gateway", "serve", "--host", "0.0.0.0"]
    assert instruction("USER") not in ("root", "0")
    assert instruction("FROM").startswith("python:3.11-slim")
    assert "8000" in instruction("EXPOSE")

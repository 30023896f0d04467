"""The shipped JS SDK (client_sdk/js/gateway-client.js) under Node against the real gateway,
with real socket drops mid-stream and mid-call: the conversation completes with nothing
lost and nothing run twice."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.data.tools import reset_gates
from tests.proxy import proxy_to
from tests.retrying_model import RetriesWhenFlaky
from tests.support import serving

SCRIPT = Path(__file__).parent / "js" / "live_resume.mjs"
SLOW_TEXT = (
    "this answer streams slowly word by word so that a test can cancel it in the middle of the"
    " stream and check that nothing else arrives afterwards even though many more words were"
    " still to come in this long and rather boring sentence that goes on and on"
)

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")


async def test_the_js_sdk_resumes_through_real_drops_and_loses_nothing():
    reset_gates()
    async with serving() as gateway, proxy_to(gateway.port) as proxy:
        gateway.model.inner = RetriesWhenFlaky(gateway.model.inner)  # type: ignore[assignment]
        node = await asyncio.create_subprocess_exec(
            "node",
            "--experimental-websocket",
            "--no-warnings",
            str(SCRIPT),
            proxy.url(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert node.stdin is not None
        assert node.stdout is not None
        assert node.stderr is not None
        drops = 0
        result = None
        try:
            async with asyncio.timeout(60):
                while line := (await node.stdout.readline()).decode():
                    if line == "drop\n":
                        drops += proxy.drop() > 0
                        node.stdin.write(b"dropped\n")
                    elif line.startswith("result "):
                        result = json.loads(line.removeprefix("result "))
                stderr = (await node.stderr.read()).decode()
                assert await node.wait() == 0, stderr
        finally:
            if node.returncode is None:
                node.kill()
                await node.wait()
    assert result is not None, stderr
    assert drops == 2
    assert result["reconnects"] == 2
    assert result["streamed"] == SLOW_TEXT  # cut mid-stream: nothing lost, nothing twice
    assert result["called"] == "calling A A=after the cut"  # cut mid-call: steps joined
    assert result["runs"] == 1  # the call ran once; its result was resent and applied once
    assert result["retried"] == "flaky but fine"
    assert result["retrying"] == ["HTTP 503"]  # response.retrying reached "*" listeners
    assert result["seqsInOrder"] is True
    assert result["stepsWhole"] is True
    assert result["states"] == [
        "connecting",
        "open",
        "reconnecting",
        "open",
        "reconnecting",
        "open",
        "closed",
    ]

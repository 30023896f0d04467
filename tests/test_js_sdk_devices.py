"""The shipped JS SDK (client_sdk/js) under Node against the real gateway: two devices on one
session (the second joins with ``join``; a client call runs on the device that declared the
function, the answer reaches both), and ``session.going_away`` (the SDK moves to a new socket
ahead of each close: nothing lost, nothing twice, the conversation goes on)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import serving

SCRIPT = Path(__file__).parent / "js" / "live_devices.mjs"
SLOW_TEXT = (
    "this answer streams slowly word by word so that a test can cancel it in the middle of the"
    " stream and check that nothing else arrives afterwards even though many more words were"
    " still to come in this long and rather boring sentence that goes on and on"
)

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")


async def run_script(url: str, scenario: str) -> dict[str, Any]:
    """Run live_devices.mjs against ``url``; its ``result`` line, parsed."""
    node = await asyncio.create_subprocess_exec(
        "node",
        "--experimental-websocket",
        "--no-warnings",
        str(SCRIPT),
        url,
        scenario,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            stdout, stderr = await node.communicate()
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
    assert node.returncode == 0, stderr.decode()
    lines = [line for line in stdout.decode().splitlines() if line.startswith("result ")]
    assert len(lines) == 1, (stdout.decode(), stderr.decode())
    result: dict[str, Any] = json.loads(lines[0].removeprefix("result "))
    return result


async def test_a_call_runs_on_the_device_that_declared_it_and_both_hear_the_answer() -> None:
    async with serving(agent=None) as gateway:  # the bundled demo agent
        result = await run_script(gateway.url, "two-devices")
    assert result["joinedSession"] is True
    assert result["phoneDevice"] is not None
    assert result["tabletDevice"] is not None
    assert result["phoneDevice"] != result["tabletDevice"]
    assert result["phoneAnswer"] == "Your battery is at 42%."
    # The call went to the tablet alone and ran there once; the phone's copy of the same
    # tool.calls (same seq) lists no call.
    assert result["tabletRuns"] == 1
    assert result["tabletCalls"] == [["get_battery_level"]]
    assert result["phoneCalls"] == [[]]
    assert "get_battery_level:completed" in result["phoneStatuses"]
    assert "get_battery_level:completed" in result["tabletStatuses"]
    assert "Your battery is at 42%." in result["tabletTexts"]
    assert "Your battery is at 42%." in result["phoneTexts"]
    assert result["phoneSeqsInOrder"] is True
    assert result["tabletSeqsInOrder"] is True  # replayed from seq 1, then live, none twice
    # The tablet's close (1000) took only the tablet away: the phone talked on.
    assert result["after"].startswith("Hello!")
    assert result["phoneStates"] == ["connecting", "open", "closed"]


async def test_going_away_moves_the_conversation_to_a_new_socket_losing_nothing() -> None:
    # Every socket gets session.going_away 0.5 s after it opened and is closed at 1.5 s: a
    # slow stream (~2.5 s) and a 0.8 s client call cross several socket switches.
    async with serving(max_socket_age=1.5, going_away_notice=1.0) as gateway:
        result = await run_script(gateway.url, "going-away")
    assert len(result["goingAway"]) >= 3, result
    assert set(result["goingAway"]) == {"max_socket_age"}
    assert result["reconnects"] == len(result["goingAway"])  # each answered by one switch
    assert result["streamed"] == SLOW_TEXT  # across the switches: nothing lost, nothing twice
    assert result["called"] == "calling A A=after a switch"
    assert result["runs"] == 1
    assert result["seqsInOrder"] is True
    # Never without a socket: no "reconnecting" state.
    assert result["states"] == ["connecting", "open", "closed"]

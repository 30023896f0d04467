"""tool_choice, per-message tools and max_steps over real sockets, from both shipped SDKs,
against a real gateway serving the demo agent (its scripted model keeps to the choice)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from client_sdk import ServerError, connect
from tests.support import serving

SCRIPT = Path(__file__).parent / "js" / "live_tool_choice.mjs"
FALLBACK = "I'm the demo assistant (a scripted model)."
STORE = "The nearest store to 92031 is Downtown, 1 Main St, 92031."


async def test_the_python_sdk_steers_tool_use_per_session_and_per_message():
    async with (
        serving(agent=None, scripted_pace=0.0) as demo,
        connect(demo.url, tool_choice="auto", max_steps=4) as conv,
    ):
        called: list[str] = []

        @conv.client_function("get_battery_level")
        async def battery() -> dict[str, object]:
            called.append("get_battery_level")
            return {"level": 0.82, "charging": False}

        @conv.client_function("get_nearest_store")
        async def store(zip_code: str) -> dict[str, object]:
            called.append("get_nearest_store")
            return {"name": "Downtown", "address": f"1 Main St, {zip_code}"}

        async def say(text: str, **options: object) -> str:
            return "".join([delta async for delta in conv.say(text, **options)])  # type: ignore[arg-type]

        # Tools off for one message: the model answers without calling the battery.
        assert (await say("what's my battery level?", tool_choice="none")).startswith(FALLBACK)
        # Narrowed to the store finder: the rule that would call both tools is passed over.
        narrowed = await say("battery and the nearest store to 92031", tools=["get_nearest_store"])
        assert narrowed == STORE
        assert called == ["get_nearest_store"]
        assert await say("what's my battery level?") == "Your battery is at 82%."
        # A session default, changed mid-session.
        await conv.update(tool_choice="none")
        assert (await say("what's my battery level?")).startswith(FALLBACK)
        assert called == ["get_nearest_store", "get_battery_level"]
        with pytest.raises(ServerError) as refused:
            await say("hello", tools=["teleport"])
        assert refused.value.code == "invalid_message"
        assert "teleport" in str(refused.value)
        # The model's requests carried what was asked, step by step.
        choices = [r.tool_choice for r in demo.model.requests]
        assert choices[0] == "none"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
async def test_the_js_sdk_steers_tool_use_per_session_and_per_message():
    async with serving(agent=None, scripted_pace=0.0) as demo:
        node = await asyncio.create_subprocess_exec(
            "node",
            "--experimental-websocket",
            "--no-warnings",
            str(SCRIPT),
            demo.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await node.communicate()
    assert node.returncode == 0, err.decode()
    (line,) = [x for x in out.decode().splitlines() if x.startswith("result ")]
    result = json.loads(line.removeprefix("result "))
    assert result["noTools"].startswith(FALLBACK)
    assert result["narrowed"] == STORE
    assert result["plain"] == "Your battery is at 82%."
    assert result["afterUpdate"].startswith(FALLBACK)
    assert "teleport" in result["refused"]
    assert result["called"] == ["get_nearest_store", "get_battery_level"]

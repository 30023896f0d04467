"""tool_choice, per-message tools, max_steps and manual tool mode over real sockets, from
both shipped SDKs, against a real gateway serving the demo agent (its scripted model keeps
to the choice)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from client_sdk import RunOnGateway, ServerError, connect
from gateway.wire.v1 import ClientCall
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


async def run_js(script: Path) -> dict[str, Any]:
    """Run a Node script of the JS SDK against a gateway serving the demo agent; the JSON of
    its ``result`` line."""
    async with serving(agent=None, scripted_pace=0.0) as demo:
        node = await asyncio.create_subprocess_exec(
            "node",
            "--experimental-websocket",
            "--no-warnings",
            str(script),
            demo.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            out, err = await node.communicate()
    assert node.returncode == 0, err.decode()
    (line,) = [x for x in out.decode().splitlines() if x.startswith("result ")]
    result: dict[str, Any] = json.loads(line.removeprefix("result "))
    return result


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
async def test_the_js_sdk_steers_tool_use_per_session_and_per_message():
    result = await run_js(SCRIPT)
    assert result["noTools"].startswith(FALLBACK)
    assert result["narrowed"] == STORE
    assert result["plain"] == "Your battery is at 82%."
    assert result["afterUpdate"].startswith(FALLBACK)
    assert "teleport" in result["refused"]
    assert result["called"] == ["get_nearest_store", "get_battery_level"]


MANUAL_SCRIPT = Path(__file__).parent / "js" / "live_manual_tools.mjs"
APP_STOCK = "Good news: we have 99 headphones in stock, at $1.50 each."


async def test_the_python_sdk_in_manual_mode_answers_or_runs_server_tools():
    async with (
        serving(agent=None, scripted_pace=0.0) as demo,
        connect(demo.url, tool_mode="manual") as conv,
    ):
        offered: list[ClientCall] = []
        decision: list[object] = [
            {"product": "headphones", "in_stock": True, "quantity": 99, "price": 1.5}
        ]

        @conv.on_server_tool
        async def handle(call: ClientCall) -> object:
            offered.append(call)
            return decision[0]

        async def say(text: str, **options: object) -> str:
            return "".join([d async for d in conv.say(text, **options)])  # type: ignore[arg-type]

        # The app answers the server tool itself: nothing ran on the gateway.
        assert await say("do you have headphones in stock?") == APP_STOCK
        assert [(c.tool, c.kind, c.args) for c in offered] == [
            ("check_stock", "server", {"product": "headphones"})
        ]
        # The app has the gateway run it, with edited arguments.
        decision[0] = RunOnGateway(args={"product": "charger"})
        ran = await say("do you have headphones in stock?")
        assert "charger" in ran
        # Back to auto for one message: the gateway runs it and the app is not asked.
        auto = await say("do you have headphones in stock?", tool_mode="auto")
        assert auto.startswith("Good news: we have")
        assert "headphones" in auto
        assert len(offered) == 2


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed")
async def test_the_js_sdk_in_manual_mode_answers_or_runs_server_tools():
    result = await run_js(MANUAL_SCRIPT)
    assert result["answeredByApp"] == APP_STOCK
    assert result["ranOnGateway"].startswith("Good news: we have")
    assert result["ranOnGateway"] != APP_STOCK
    assert result["auto"] == result["ranOnGateway"]
    assert result["offered"] == [
        ["check_stock", "server", {"product": "headphones"}],
        ["check_stock", "server", {"product": "headphones"}],
    ]

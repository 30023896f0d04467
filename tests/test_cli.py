"""The real command line: `gateway serve` as a subprocess, JSON logs, startup errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import websockets

from gateway.wire.v1 import ResponseDone, ToolResult, ToolResults
from tests.support import say_until_calls, session, streamed_text

GATEWAY = [sys.executable, "-m", "gateway"]


async def test_serve_runs_the_demo_and_logs_json_with_ids():
    proc = await asyncio.create_subprocess_exec(
        *GATEWAY,
        "serve",
        "--port",
        "0",
        "--no-auth",
        "--scripted-pace",
        "0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "GATEWAY_LOG_LEVEL": "info"},
    )
    assert proc.stderr is not None
    lines: list[dict[str, object]] = []
    port_found: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def read_logs() -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            record = json.loads(raw)  # every line is one JSON object
            lines.append(record)
            match = re.search(r"running on http://127\.0\.0\.1:(\d+)", str(record["event"]))
            if match and not port_found.done():
                port_found.set_result(int(match.group(1)))

    reader = asyncio.create_task(read_logs())
    try:
        async with asyncio.timeout(20):
            port = await port_found
        async with session(f"ws://127.0.0.1:{port}/v1/realtime") as (conn, created):
            calls = await say_until_calls(conn, "what's my battery level?")
            call = calls.calls[0]
            result = ToolResult(call_id=call.call_id, tool=call.tool, output={"level": 0.5})
            await conn.send(ToolResults(results=[result]))
            events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert streamed_text(events) == "Your battery is at 50%."
        # A token in the URL is checked even under --no-auth, and kept out of the logs.
        with pytest.raises(websockets.ConnectionClosed) as refused:
            await _first_event(f"ws://127.0.0.1:{port}/v1/realtime?token=forged.token.value")
        assert refused.value.rcvd is not None
        assert refused.value.rcvd.code == 4001
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await proc.wait()
            await reader
    assert code == 0  # graceful shutdown: see test_lifecycle
    assert any("Finished server process" in str(line["event"]) for line in lines)
    finished = [line for line in lines if line["event"] == "response_finished"]
    assert finished
    assert finished[0]["session_id"] == created.session_id
    assert finished[0]["response_id"] == calls.response_id
    assert finished[0]["status"] == "completed"
    sent = next(line for line in lines if line["event"] == "client_call_sent")
    assert (sent["call_id"], sent["tool"]) == (call.call_id, "get_battery_level")
    assert "args" not in sent  # sizes only, never arguments, at INFO
    everything = "\n".join(json.dumps(line) for line in lines)
    assert "battery level" not in everything  # the user's text is never logged
    assert '"level": 0.5' not in everything  # nor a tool's output
    starting = next(line for line in lines if line["event"] == "gateway_starting")
    assert (starting["agent"], starting["provider"]) == ("demo", "scripted")
    assert any("[redacted]" in str(line["event"]) for line in lines)
    assert not [line for line in lines if "forged.token.value" in json.dumps(line)]


@pytest.mark.parametrize(("loop", "chosen"), [("auto", "uvloop"), ("asyncio", "asyncio")])
async def test_startup_line_names_the_model_provider_and_base_url(loop, chosen):
    proc = await asyncio.create_subprocess_exec(
        *GATEWAY,
        "serve",
        "--port",
        "0",
        "--loop",
        loop,
        "--model",
        "openai:some-model",
        "--base-url",
        "http://127.0.0.1:9/v1",  # never called: no session is started
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "GATEWAY_LOG_LEVEL": "info", "OPENAI_API_KEY": "sk-secret-key"},
    )
    assert proc.stderr is not None
    lines: list[dict[str, object]] = []
    try:
        async with asyncio.timeout(20):
            async for raw in proc.stderr:
                lines.append(json.loads(raw))
                if "running on" in str(lines[-1]["event"]):
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.communicate()
    starting = next(line for line in lines if line["event"] == "gateway_starting")
    assert starting["provider"] == "openai"
    assert starting["model"] == "some-model"
    assert starting["base_url"] == "http://127.0.0.1:9/v1"
    # uvloop is a dependency on Linux: the default serves on it.
    assert next(line for line in lines if line["event"] == "event_loop_chosen")["loop"] == chosen
    assert "sk-secret-key" not in json.dumps(lines)
    # No API key on a loopback host: served as under --no-auth, and said loudly.
    disabled = next(line for line in lines if line["event"] == "auth_disabled")
    assert "no API key configured" in str(disabled["note"])


async def _first_event(url: str) -> None:
    async with session(url):
        pass


async def run_failing(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *GATEWAY, *args, stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    async with asyncio.timeout(20):
        _, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_bad_agent_file_fails_at_startup_naming_file_tool_and_reason(tmp_path: Path):
    agent = tmp_path / "agent.toml"
    agent.write_text('name = "x"\n[[client_functions]]\nname = "OpenSettings"\ndescription = "d"\n')
    code, err = await run_failing("serve", "--port", "0", "--agent", str(agent))
    assert code == 2
    assert str(agent) in err
    assert "'OpenSettings'" in err
    assert "snake_case" in err


async def test_misspelt_environment_variable_fails_at_startup():
    code, err = await run_failing("serve", "--port", "0", env={"GATEWAY_PROT": "1"})
    assert code == 2
    assert "prot" in err


async def test_schema_command_prints_the_committed_schema():
    proc = await asyncio.create_subprocess_exec(*GATEWAY, "schema", stdout=asyncio.subprocess.PIPE)
    async with asyncio.timeout(20):
        out, _ = await proc.communicate()
    committed = Path(__file__).parents[1] / "client_sdk" / "js" / "protocol.schema.json"
    assert json.loads(out) == json.loads(committed.read_text())


async def test_serve_refuses_to_start_without_auth_on_a_public_address():
    code, err = await run_failing("serve", "--port", "0", "--host", "0.0.0.0", "--no-auth")
    assert code == 2
    assert "--no-auth" in err
    assert "'0.0.0.0'" in err


async def test_serve_refuses_to_start_with_auth_on_and_no_api_key(tmp_path: Path):
    code, err = await run_failing("serve", "--port", "0", "--host", "0.0.0.0")
    assert code == 2
    assert "no API key is configured" in err
    keys = tmp_path / "keys.txt"
    keys.write_text("# backends\nbackend:short\n")
    code, err = await run_failing("serve", "--port", "0", "--api-keys-file", str(keys))
    assert code == 2
    assert f"{keys}: entry 2" in err
    assert "backend:short" not in err

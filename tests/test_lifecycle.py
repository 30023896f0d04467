"""Keepalive (a dead peer is detected, its session waits) and graceful shutdown on SIGTERM."""

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

from client_sdk import connect_raw
from gateway.wire.v1 import (
    ResponseDone,
    SessionCreated,
    SessionGoingAway,
    SessionResume,
    SessionResumed,
    SessionStart,
    TextDelta,
    ToolCalls,
    ToolResult,
    ToolResults,
    UserMessage,
)
from tests.data.tools import gate, reset_gates
from tests.support import TEST_AGENT, serving, session, streamed_text


async def test_a_peer_that_stops_answering_pings_is_dropped_and_its_session_waits():
    async with serving(ws_ping_interval=0.1, ws_ping_timeout=0.2) as gateway:
        async with connect_raw(gateway.url) as conn:
            await conn.send(SessionStart())
            created = await conn.recv()
            assert isinstance(created, SessionCreated)
            server_side = gateway.runtime.drivers[created.session_id].connection
            assert server_side is not None
            conn.websocket.transport.pause_reading()  # no more pongs: the peer looks dead
            await asyncio.wait_for(server_side.done.wait(), 10)
            conn.websocket.transport.abort()
        assert created.session_id in gateway.runtime.drivers  # waiting for a resume
        async with connect_raw(gateway.url) as conn:
            await conn.send(
                SessionResume(
                    session_id=created.session_id,
                    resume_token=created.resume_token,
                    last_seq=created.seq,
                )
            )
            resumed = await conn.recv()
            assert isinstance(resumed, SessionResumed)
            await conn.send(UserMessage(text="echo alive"))
            events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    assert streamed_text(events) == "alive"


async def start_gateway(
    *flags: str,
) -> tuple[asyncio.subprocess.Process, int, asyncio.Task[None]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--port",
        "0",
        "--agent",
        str(TEST_AGENT),
        "--no-auth",
        *flags,
        stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).parents[1],
        env={**os.environ, "GATEWAY_LOG_LEVEL": "info"},
    )
    assert proc.stderr is not None
    async with asyncio.timeout(20):
        async for raw in proc.stderr:
            found = re.search(r"running on http://127\.0\.0\.1:(\d+)", json.loads(raw)["event"])
            if found:
                break
    assert found is not None
    drain = asyncio.create_task(_drain(proc))  # keep the pipe from filling up
    return proc, int(found.group(1)), drain


async def _drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    async for _ in proc.stderr:
        pass


@pytest.mark.parametrize(
    ("grace", "status"),
    [("10", "completed"), ("0.2", "incomplete")],
    ids=["the running response finishes", "the running response is cut"],
)
async def test_sigterm_closes_every_socket_with_1012_and_exits_0(grace, status):
    proc, port, logs = await start_gateway("--shutdown-timeout", grace)
    try:
        async with connect_raw(f"ws://127.0.0.1:{port}/v1/realtime") as conn:
            await conn.send(SessionStart())
            await conn.recv()
            await conn.send(UserMessage(text="slowtext"))
            await conn.recv_until(lambda e: isinstance(e, TextDelta))
            proc.send_signal(signal.SIGTERM)
            events = await conn.recv_until(lambda e: isinstance(e, ResponseDone), within=20)
            notice = await conn.recv(within=20)  # told before the close (session.going_away)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await conn.recv(within=20)
        async with asyncio.timeout(20):
            code = await proc.wait()
            await logs
    finally:
        if proc.returncode is None:
            proc.kill()
    done = events[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == status
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1012, "service restart")
    assert isinstance(notice, SessionGoingAway)
    assert (notice.reason, notice.time_left) == ("shutdown", 0.0)
    assert code == 0


async def test_a_session_started_during_the_grace_period_is_refused_with_1012_and_none_is_left():
    reset_gates()
    async with serving() as gateway:
        runtime = gateway.runtime
        async with (
            session(gateway.url) as (busy, _),
            connect_raw(gateway.url) as late,  # accepted before the shutdown, silent till then
        ):
            await busy.send(UserMessage(text="mixed"))  # a client call and a blocking tool
            calls = (await busy.recv_until(lambda e: isinstance(e, ToolCalls)))[-1]
            assert isinstance(calls, ToolCalls)
            stopping = asyncio.create_task(runtime.shutdown(grace=20))
            await asyncio.sleep(0)  # one loop turn: the shutdown has begun, its grace runs
            assert runtime.closing
            await late.send(SessionStart())
            with pytest.raises(websockets.ConnectionClosed) as refused:
                await late.recv()
            assert len(runtime.drivers) == 1  # the late socket's session never started
            # The running response finishes within the grace, then its socket gets 1012.
            call = next(c for c in calls.calls if c.tool == "device_a")
            result = ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "v"})
            await busy.send(ToolResults(results=[result]))
            gate("block").set()
            events = await busy.recv_until(lambda e: isinstance(e, ResponseDone))
            notice = await busy.recv()  # session.going_away, then the close
            with pytest.raises(websockets.ConnectionClosed) as stopped:
                await busy.recv()
            await asyncio.wait_for(stopping, 10)
    assert isinstance(notice, SessionGoingAway)
    assert refused.value.rcvd is not None
    assert (refused.value.rcvd.code, refused.value.rcvd.reason) == (1012, "shutting down")
    assert isinstance(events[-1], ResponseDone)
    assert events[-1].status == "completed"
    assert stopped.value.rcvd is not None
    assert (stopped.value.rcvd.code, stopped.value.rcvd.reason) == (1012, "service restart")
    assert runtime.drivers == {}

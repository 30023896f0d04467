"""Operations from outside: /metrics after real conversations, /readyz, log lines that survive."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from client_sdk import connect_raw
from gateway.wire.v1 import SessionResume, ToolResult, ToolResults, ToolStatus
from tests.mock_llm import mock_llm
from tests.support import say, say_until_calls, serving, session, streamed_text

ROOT = Path(__file__).parents[1]
PROVIDER_AGENT = Path(__file__).parent / "data" / "provider_agent.toml"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def http_url(ws_url: str, path: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/v1/realtime") + path


async def scrape(ws_url: str) -> Samples:
    async with httpx.AsyncClient() as client:
        response = await client.get(http_url(ws_url, "/metrics"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_a_conversation():
    async with serving() as gateway:
        async with session(gateway.url) as (conn, created):
            assert streamed_text(await say(conn, "echo hello")) == "hello"

            calls = await say_until_calls(conn, "one")  # a client function
            (call,) = calls.calls
            await conn.send(
                ToolResults(
                    results=[
                        ToolResult(call_id=call.call_id, tool=call.tool, output={"value": "x"})
                    ]
                )
            )
            events = await conn.recv_until(lambda e: type(e).__name__ == "ResponseDone")
            assert streamed_text(events) == "A=x"

            events = await say(conn, "add 2 3")  # a server tool
            assert [e.status for e in events if isinstance(e, ToolStatus)] == [
                "running",
                "completed",
            ]

            await conn.websocket.send('{"type": "user.message"}')  # no text: a bad frame
            error = await conn.recv()
            assert error.code == "invalid_message"  # type: ignore[union-attr]

            async with connect_raw(gateway.url) as intruder:
                wrong = SessionResume(
                    session_id=created.session_id, resume_token="not-the-token", last_seq=0
                )
                await intruder.send(wrong)
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await intruder.recv()
                assert closed.value.rcvd is not None
                assert closed.value.rcvd.code == 4001

            live = await scrape(gateway.url)

        await asyncio.wait_for(gateway.runtime.idle.wait(), 5)
        after = await scrape(gateway.url)

    assert value(live, "gateway_sessions_started_total") == 1
    assert value(live, "gateway_sessions_live") == 1
    assert value(live, "gateway_sockets_attached") == 1
    assert value(live, "gateway_sessions_detached") == 0
    assert value(live, "gateway_socket_attaches_total", kind="new") == 1
    assert value(live, "gateway_events_sent_total", type="session.created") == 1
    assert value(live, "gateway_events_sent_total", type="response.created") == 3
    assert value(live, "gateway_events_sent_total", type="response.done") == 3
    assert value(live, "gateway_events_sent_total", type="tool.calls") == 1
    assert value(live, "gateway_events_sent_total", type="text.delta") >= 3
    assert value(live, "gateway_responses_total", status="completed") == 3
    assert value(live, "gateway_time_to_first_delta_seconds_count") == 3
    for kind in ("client", "server"):
        assert value(live, "gateway_tool_latency_seconds_count", kind=kind, status="completed") == 1
    assert value(live, "gateway_errors_sent_total", code="invalid_message") == 1
    assert value(live, "gateway_connections_rejected_total", reason="wrong_resume_token") == 1

    # The session ended (the client closed with 1000): every gauge is back to zero.
    for gauge in ("gateway_sessions_live", "gateway_sockets_attached", "gateway_sessions_detached"):
        assert value(after, gauge) == 0, gauge


async def test_each_gateway_has_its_own_metrics():
    async with serving() as first, serving() as second:
        async with session(first.url) as (conn, _):
            await say(conn, "echo hi")
        assert value(await scrape(first.url), "gateway_sessions_started_total") == 1
        assert value(await scrape(second.url), "gateway_sessions_started_total") == 0


class DetachWatcher:
    """A session observer that sets ``gone`` when the session's socket goes."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    def started(self, now: float) -> None: ...

    def sent(self, msg: object, now: float) -> None: ...

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None: ...

    def detached(self, *, ended: bool, now: float) -> None:
        self.gone.set()

    def ended(self, now: float) -> None: ...


async def test_a_dropped_socket_counts_as_detached_until_its_resume():
    async with serving() as gateway:
        async with session(gateway.url) as (conn, created):
            await say(conn, "echo hi")
            watcher = DetachWatcher()
            gateway.runtime.drivers[created.session_id].add_observer(watcher)
            conn.websocket.transport.abort()  # dropped, as a phone does
            await asyncio.wait_for(watcher.gone.wait(), 5)
        detached = await scrape(gateway.url)
        async with connect_raw(gateway.url) as conn:
            resume = SessionResume(
                session_id=created.session_id, resume_token=created.resume_token, last_seq=0
            )
            await conn.send(resume)
            await conn.recv()  # session.resumed
            attached = await scrape(gateway.url)
    assert value(detached, "gateway_sessions_detached") == 1
    assert value(detached, "gateway_sockets_attached") == 0
    assert value(attached, "gateway_sessions_detached") == 0
    assert value(attached, "gateway_sockets_attached") == 1
    assert value(attached, "gateway_socket_attaches_total", kind="resume") == 1
    assert value(attached, "gateway_events_sent_total", type="session.resumed") == 1


async def test_provider_retries_are_counted():
    async with mock_llm() as llm:
        async with serving(
            agent=str(PROVIDER_AGENT),
            model="openai:mock-model",
            base_url=llm.base_url("openai"),
        ) as gateway:
            await llm.script(
                {"type": "fail", "status": 503, "retry_after": 0},
                {"type": "reply", "text": "second time lucky"},
            )
            async with session(gateway.url) as (conn, _):
                assert streamed_text(await say(conn, "hi")) == "second time lucky"
            samples = await scrape(gateway.url)
    retried = value(samples, "gateway_provider_retries_total", provider="openai", reason="http_503")
    assert retried == 1


async def test_readyz_is_ready_then_not_ready_while_shutting_down():
    async with serving() as gateway, httpx.AsyncClient() as client:
        ready = await client.get(http_url(gateway.url, "/readyz"))
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        assert (await client.get(http_url(gateway.url, "/healthz"))).status_code == 200

        await gateway.runtime.shutdown(1.0)  # what SIGTERM starts; the server still answers
        stopping = await client.get(http_url(gateway.url, "/readyz"))
        assert stopping.status_code == 503
        assert stopping.json() == {"status": "not_ready", "reason": "shutting_down"}
        # Alive but not ready: the load balancer stops sending, the orchestrator waits.
        assert (await client.get(http_url(gateway.url, "/healthz"))).status_code == 200


async def test_readyz_says_when_the_store_does_not_answer():
    async with serving() as gateway, httpx.AsyncClient() as client:

        async def unreachable() -> None:
            # The in-process store always answers; a networked one (Redis) fails like this.
            raise ConnectionRefusedError("store down")

        gateway.runtime.store.ping = unreachable  # type: ignore[method-assign]
        answer = await client.get(http_url(gateway.url, "/readyz"))
    assert answer.status_code == 503
    assert answer.json() == {"status": "not_ready", "reason": "store_not_answering"}


_LOG_UNENCODABLE = """
import structlog
from gateway.logging import configure_logging

class Opaque:
    def __repr__(self):
        return "<opaque>"

configure_logging("info", json=True)
log = structlog.get_logger("test")
loop = []
loop.append(loop)
log.info("odd_values_logged", opaque=Opaque(), raw=b"\\xff\\x00", tags={"b", "a"},
         failure=ValueError("boom"), keyed={(1, 2): "tuple key"}, loop=loop)
log.info("next_line_logged")
"""


def test_a_log_line_with_unencodable_values_is_still_one_json_line():
    done = subprocess.run(
        [sys.executable, "-c", _LOG_UNENCODABLE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["event"] for line in lines] == ["odd_values_logged", "next_line_logged"]
    odd = lines[0]
    assert odd["opaque"] == "<opaque>"
    assert odd["failure"] == "ValueError('boom')"
    assert sorted(odd["tags"]) == ["a", "b"]
    assert isinstance(odd["raw"], str)
    assert "tuple key" in json.dumps(odd["keyed"])
    assert odd["level"] == "info"

"""Push notices when no device is connected, against a real local HTTP receiver.

The receiver is a plain asyncio HTTP server on port 0 that records every request and
answers as the test scripts it: a status, or ``hang`` (never answers). The gateway runs
``tests/data/notify_agent.toml``, copied with the receiver's URL; a test detaches a client
the way a phone does (the socket aborted, no close frame), opens the gate of an async tool,
and reads what the receiver got.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from client_sdk import Connection
from gateway.agent.file import Webhook, load_agent
from gateway.core.tool import ToolDef
from gateway.errors import ConfigError
from gateway.shell.notify import MAX_TEXT, Notice, Notifier, PushObserver, sign
from gateway.wire.v1 import (
    ConfirmItem,
    ResponseCreated,
    ResponseDone,
    SessionCreated,
    SessionResumed,
    ToolConfirm,
    ToolStatus,
)
from tests.data.tools import gate, reset_gates
from tests.support import Gateway, resuming, say, serving, session

DATA = Path(__file__).parent / "data"
SECRET = "test-notify-secret"
WAIT = 5.0
"""Seconds any wait of these tests may take before it fails."""


# ------------------------------------------------------------------ the receiver


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """A local HTTP server answering each POST with the next of ``answers`` (the last
    repeats): an HTTP status, or ``"hang"`` to never answer."""

    answers: list[int | str]
    retry_after: str | None = None
    requests: list[Received] = field(default_factory=list)
    url: str = ""
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _hanging: asyncio.Event = field(default_factory=asyncio.Event)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")[1:]
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in lines if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answer = self.answers[min(len(self.requests), len(self.answers) - 1)]
            self.requests.append(Received(headers, body, time.monotonic()))
            self._arrived.set()
            if answer == "hang":
                await self._hanging.wait()  # until the test ends
                return
            extra = f"Retry-After: {self.retry_after}\r\n" if self.retry_after else ""
            status = f"HTTP/1.1 {answer} X\r\nContent-Length: 0\r\n{extra}Connection: close\r\n"
            writer.write(f"{status}\r\n".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def wait_for(self, count: int) -> list[Received]:
        async with asyncio.timeout(WAIT):
            while len(self.requests) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.requests

    def release(self) -> None:
        self._hanging.set()


async def receiving(*answers: int | str, retry_after: str | None = None) -> Receiver:
    """A started receiver (its server closed when the loop's test ends)."""
    receiver = Receiver(list(answers), retry_after=retry_after)
    server = await asyncio.start_server(receiver._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    receiver.url = f"http://127.0.0.1:{port}/notify"
    _SERVERS.append((server, receiver))
    return receiver


_SERVERS: list[tuple[asyncio.Server, Receiver]] = []


@pytest.fixture(autouse=True)
async def close_receivers() -> AsyncIterator[None]:
    yield
    while _SERVERS:
        server, receiver = _SERVERS.pop()
        receiver.release()
        server.close()
        await server.wait_closed()


def refused_url() -> str:
    """A local URL nothing listens on (connection refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/notify"


def documented_verifier() -> Callable[[bytes, dict[str, str], bytes], Any]:
    """``verify_notice`` as docs/mobile.md gives it to receivers: the doc's snippet, run."""
    page = (Path(__file__).parents[1] / "docs" / "mobile.md").read_text()
    blocks = [block.split("```", 1)[0] for block in page.split("```python\n")[1:]]
    (code,) = [block for block in blocks if "def verify_notice" in block]
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    verifier: Callable[[bytes, dict[str, str], bytes], Any] = namespace["verify_notice"]
    return verifier


def verify(received: Received) -> dict[str, object]:
    """What a receiver does: check the signature over the timestamp and the exact body,
    with the documented snippet; a byte changed fails it."""
    verify_notice = documented_verifier()
    body = verify_notice(SECRET.encode(), received.headers, received.body)
    assert isinstance(body, dict)
    with pytest.raises(ValueError, match="bad signature"):
        verify_notice(SECRET.encode(), received.headers, received.body.replace(b"}", b" }"))
    with pytest.raises(ValueError, match="bad signature"):
        verify_notice(b"another secret", received.headers, received.body)
    assert received.headers["x-gateway-notice-id"] == body["notice_id"]
    assert received.headers["content-type"] == "application/json"
    return body


# ------------------------------------------------------------------ the gateway


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_NOTIFY_SECRET", SECRET)


def agent_file(tmp_path: Path, url: str) -> Path:
    """``notify_agent.toml`` with ``url`` as its webhook (the scenario found where it is)."""
    text = (DATA / "notify_agent.toml").read_text()
    text = text.replace("http://127.0.0.1:9/notify", url)
    text = text.replace('"scenario.toml"', json.dumps(str(DATA / "scenario.toml")))
    path = tmp_path / "notify_agent.toml"
    path.write_text(text)
    return path


async def cut(conn: Connection, gateway: Gateway, session_id: str) -> None:
    """Lose the socket as a phone does (no close frame), and wait until the session knows."""
    conn.websocket.transport.abort()
    await asyncio.wait_for(conn.websocket.wait_closed(), WAIT)
    await asyncio.wait_for(gateway.runtime.drivers[session_id].detached.wait(), WAIT)


async def idle(gateway: Gateway) -> None:
    notifier = gateway.runtime.notifier
    assert notifier is not None
    await asyncio.wait_for(notifier.idle(), WAIT)


@pytest.fixture(autouse=True)
def gates() -> None:
    reset_gates()


async def test_a_detached_sessions_async_result_sends_one_signed_notice_then_replays(
    tmp_path: Path, secret: None
) -> None:
    receiver = await receiving(200)
    async with serving(agent=str(agent_file(tmp_path, receiver.url))) as gateway:
        async with session(gateway.url) as (conn, created):
            first = await say(conn, "order 1234")
            pending = first[1]
            assert isinstance(pending, ToolStatus)
            assert pending.status == "pending"
            last_seen = first[-1].seq
            await cut(conn, gateway, created.session_id)
        gate("order:1234").set()
        (received,) = await receiver.wait_for(1)
        body = verify(received)
        assert body["kind"] == "tool_result"
        assert body["session_id"] == created.session_id
        assert body["call_id"] == pending.call_id
        assert body["tool"] == "lookup_order"
        assert body["status"] == "completed"
        assert body["text"] == "Lookup order completed"
        assert "shipped" not in received.body.decode()  # never the result
        seq = body["seq"]
        assert isinstance(seq, int)
        assert seq > last_seen

        # The app, woken by the push, resumes and gets the event by replay.
        async with resuming(gateway.url, created, last_seen) as (conn, resumed):
            assert isinstance(resumed, SessionResumed)
            replayed = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        completed = next(e for e in replayed if e.seq == seq)
        assert isinstance(completed, ToolStatus)
        assert (completed.call_id, completed.status) == (pending.call_id, "completed")
        assert completed.result == {"order_id": "1234", "status": "shipped"}
        # The response that told the result started while detached too: no second notice.
        told = next(e for e in replayed if isinstance(e, ResponseCreated))
        assert told.call_id == pending.call_id
        await idle(gateway)
        assert len(receiver.requests) == 1


async def test_the_gateway_retries_a_receiver_answering_500(tmp_path: Path, secret: None) -> None:
    receiver = await receiving(500, 200)
    async with serving(agent=str(agent_file(tmp_path, receiver.url))) as gateway:
        async with session(gateway.url) as (conn, created):
            await say(conn, "order 1234")
            await cut(conn, gateway, created.session_id)
        gate("order:1234").set()
        first, second = await receiver.wait_for(2)
        assert verify(first) == verify(second)  # one notice, signed at each attempt
        await idle(gateway)
        assert len(receiver.requests) == 2


async def test_an_attached_session_sends_no_notice(tmp_path: Path, secret: None) -> None:
    receiver = await receiving(200)
    async with serving(agent=str(agent_file(tmp_path, receiver.url))) as gateway:
        async with session(gateway.url) as (conn, _):
            await say(conn, "order 1234")
            gate("order:1234").set()
            later = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
            assert any(isinstance(e, ToolStatus) and e.status == "completed" for e in later)
        await idle(gateway)
    assert receiver.requests == []


async def test_a_hanging_receiver_slows_no_session(tmp_path: Path, secret: None) -> None:
    receiver = await receiving("hang")
    async with serving(agent=str(agent_file(tmp_path, receiver.url))) as gateway:
        async with session(gateway.url) as (conn, created):
            first = await say(conn, "order 1234")
            await cut(conn, gateway, created.session_id)
        gate("order:1234").set()
        await receiver.wait_for(1)  # the notice's POST hangs from now on
        async with session(gateway.url) as (other, _):
            started = time.monotonic()
            for _ in range(5):
                await say(other, "echo still here")
            assert time.monotonic() - started < 1.0
        async with resuming(gateway.url, created, first[-1].seq) as (conn, resumed):
            assert isinstance(resumed, SessionResumed)
            replayed = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert any(isinstance(e, ToolStatus) and e.status == "completed" for e in replayed)
        assert len(receiver.requests) == 1  # still the first attempt: its timeout is 10 s


# ------------------------------------------------------------------ delivery


def a_notice(number: int = 1) -> Notice:
    return Notice(
        notice_id=f"ntc_{number}",
        kind="tool_result",
        session_id="sess_1",
        seq=7,
        ts=time.time(),
        text="Lookup order completed",
        call_id="call_1",
        tool="lookup_order",
        status="completed",
    )


def notifier(url: str, **bounds: float) -> Notifier:
    quick: dict[str, float] = {"backoff": 0.01, "attempt_timeout": 1.0, "max_seconds": 5.0}
    quick.update(bounds)
    return Notifier(Webhook(url, SECRET.encode()), **quick)  # type: ignore[arg-type]


def outcome(sender: Notifier, label: str) -> float:
    return float(sender.outcomes.labels(label)._value.get())


async def deliver(sender: Notifier, notice: Notice) -> list[dict[str, object]]:
    """Send ``notice`` and wait until it is delivered or given up; its log lines."""
    with structlog.testing.capture_logs() as logs:
        sender.notify(notice)
        await asyncio.wait_for(sender.idle(), WAIT + 5)
    await sender.aclose()
    return [dict(line) for line in logs]


async def test_a_receiver_that_is_down_is_retried_up_to_the_bound_then_given_up() -> None:
    sender = notifier(refused_url(), max_attempts=4)
    logs = await deliver(sender, a_notice())
    retries = [line for line in logs if line["event"] == "notify_retrying"]
    assert [line["attempt"] for line in retries] == [1, 2, 3]
    (failed,) = [line for line in logs if line["event"] == "notify_failed"]
    assert failed["attempts"] == 4
    assert failed["reason"] == "ConnectError"
    assert (failed["session_id"], failed["call_id"]) == ("sess_1", "call_1")
    assert outcome(sender, "failed") == 1


async def test_a_500_is_retried_and_the_notice_arrives_on_the_retry() -> None:
    receiver = await receiving(500, 200)
    sender = notifier(receiver.url)
    logs = await deliver(sender, a_notice())
    first, second = receiver.requests
    assert verify(first) == verify(second)  # the same notice, signed at each attempt
    (sent,) = [line for line in logs if line["event"] == "notify_sent"]
    assert (sent["attempts"], sent["status"], sent["notice_id"]) == (2, 200, "ntc_1")
    assert outcome(sender, "sent") == 1


async def test_a_hanging_receiver_is_retried_and_given_up_within_the_time_bound() -> None:
    receiver = await receiving("hang")
    sender = notifier(receiver.url, attempt_timeout=0.2, max_seconds=1.0, max_attempts=50)
    started = time.monotonic()
    logs = await deliver(sender, a_notice())
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 1.5
    (failed,) = [line for line in logs if line["event"] == "notify_failed"]
    assert failed["reason"] == "timeout"
    assert failed["attempts"] == len(receiver.requests)
    assert 2 <= len(receiver.requests) < 50


async def test_a_refusal_other_than_429_is_not_retried() -> None:
    receiver = await receiving(400, 200)
    sender = notifier(receiver.url)
    logs = await deliver(sender, a_notice())
    assert len(receiver.requests) == 1
    (failed,) = [line for line in logs if line["event"] == "notify_failed"]
    assert (failed["attempts"], failed["reason"]) == (1, "HTTP 400")


async def test_429_retry_after_is_honored_within_the_bound() -> None:
    receiver = await receiving(429, 200, retry_after="0")
    sender = notifier(receiver.url)
    await deliver(sender, a_notice())
    assert len(receiver.requests) == 2
    assert outcome(sender, "sent") == 1

    later = await receiving(429, 200, retry_after="30")  # past max_seconds: give up now
    sender = notifier(later.url, max_seconds=2.0)
    started = time.monotonic()
    logs = await deliver(sender, a_notice())
    assert time.monotonic() - started < 1.0
    assert len(later.requests) == 1
    assert [line["reason"] for line in logs if line["event"] == "notify_failed"] == ["HTTP 429"]


async def test_past_the_pending_bound_the_oldest_notice_is_dropped() -> None:
    receiver = await receiving("hang")
    sender = Notifier(Webhook(receiver.url, SECRET.encode()), max_pending=2, senders=1)
    with structlog.testing.capture_logs() as logs:
        for number in range(1, 5):
            sender.notify(a_notice(number))
    await receiver.wait_for(1)
    dropped = [line["notice_id"] for line in logs if line["event"] == "notify_dropped"]
    assert dropped == ["ntc_1", "ntc_2"]
    assert outcome(sender, "dropped") == 2
    assert json.loads(receiver.requests[0].body)["notice_id"] == "ntc_3"
    await sender.aclose()


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"kind":"tool_result"}'
    mac = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(b"k", "1700000000", body) == f"sha256={mac}"


# ------------------------------------------------------------------ what wants attention


def lookup(name: str) -> ToolDef | None:
    return ToolDef(
        name=name,
        description="",
        kind="server",
        input_schema={"type": "object"},
        execution="async" if name.startswith("lookup") else "sync",
    )


def watched() -> tuple[PushObserver, list[Notice]]:
    notices: list[Notice] = []
    observer = PushObserver("sess_1", notices.append, lookup)
    observer.detached(ended=False, now=0.0)
    return observer, notices


def test_one_notice_per_call_and_none_for_sync_tools_or_duplicates() -> None:
    observer, notices = watched()
    done = ToolStatus(seq=5, call_id="c1", tool="lookup_order", status="completed")
    observer.sent(done, 1.0)
    observer.sent(ToolStatus(seq=6, call_id="c1", tool="lookup_order", status="completed"), 1.0)
    observer.sent(ToolStatus(seq=7, call_id="c2", tool="add", status="completed"), 1.0)
    observer.sent(
        ToolStatus(seq=8, call_id="c3", tool="lookup_order", status="completed", duplicate=True),
        1.0,
    )
    observer.sent(ToolStatus(seq=9, call_id="c4", tool="lookup_order", status="progress"), 1.0)
    observer.sent(ResponseCreated(seq=10, response_id="r1", call_id="c1"), 1.0)  # tells c1
    observer.sent(ResponseCreated(seq=11, response_id="r2", in_reply_to="m1"), 1.0)
    observer.sent(ToolStatus(seq=12, call_id="c5", tool="lookup_order", status="failed"), 1.0)
    assert [(n.kind, n.seq, n.call_id, n.text) for n in notices] == [
        ("tool_result", 5, "c1", "Lookup order completed"),
        ("tool_result", 12, "c5", "Lookup order failed"),
    ]


def test_a_self_started_response_and_a_confirmation_want_attention() -> None:
    observer, notices = watched()
    observer.sent(ResponseCreated(seq=3, response_id="r1"), 1.0)
    item = ConfirmItem(
        call_id="c9",
        tool="cancel_order",
        display_name="Cancel order",
        args={"order_id": "1234"},
        prompt="Cancel order 1234? " * 20,
        deadline=100.0,
        timeout=60.0,
    )
    observer.sent(ToolConfirm(seq=4, response_id="r1", calls=[item, item]), 1.0)
    response, confirm = notices
    assert (response.kind, response.response_id, response.seq) == ("response", "r1", 3)
    assert (confirm.kind, confirm.call_id, confirm.tool) == ("confirmation", "c9", "cancel_order")
    assert len(confirm.text) <= MAX_TEXT
    assert confirm.text.endswith(" (+1 more)")


def test_nothing_while_attached_nor_after_the_end() -> None:
    observer, notices = watched()
    observer.attached(resumed=True, replaced=False, now=1.0)
    observer.sent(ToolStatus(seq=5, call_id="c1", tool="lookup_order", status="completed"), 1.0)
    observer.detached(ended=True, now=2.0)  # closed with 1000: the session ends
    observer.sent(ToolStatus(seq=6, call_id="c2", tool="lookup_order", status="failed"), 2.0)
    observer.detached(ended=False, now=2.0)
    observer.ended(3.0)
    observer.sent(ResponseCreated(seq=6, response_id="r1"), 3.0)
    assert notices == []


# ------------------------------------------------------------------ the agent file


def write_agent(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "agent.toml"
    scenario = json.dumps(str(DATA / "scenario.toml"))
    path.write_text(f'name = "n"\n{lines}\n[model]\nprovider = "scripted"\nscenario = {scenario}\n')
    return path


def test_the_webhook_is_checked_at_startup(tmp_path: Path, secret: None) -> None:
    local = 'notify_url = "http://localhost:8080/n"\nnotify_secret_env = "TEST_NOTIFY_SECRET"'
    webhook = load_agent(write_agent(tmp_path, local)).notify
    assert webhook == Webhook("http://localhost:8080/n", SECRET.encode())
    assert SECRET not in repr(webhook)
    for lines, error in [
        ('notify_url = "http://example.com/n"\nnotify_secret_env = "X"', "http:// only to"),
        ('notify_url = "ftp://example.com/n"\nnotify_secret_env = "X"', "expected an https"),
        ('notify_url = "https://example.com/n"', "notify_secret_env must name"),
        ('notify_secret_env = "TEST_NOTIFY_SECRET"', "without notify_url"),
        (
            'notify_url = "https://example.com/n"\nnotify_secret_env = "TEST_NOTIFY_UNSET"',
            "TEST_NOTIFY_UNSET is not set",
        ),
    ]:
        with pytest.raises(ConfigError, match=error):
            load_agent(write_agent(tmp_path, lines))


async def test_no_webhook_no_notifier() -> None:
    async with serving() as gateway:
        assert gateway.runtime.notifier is None
        async with session(gateway.url) as (_, created):
            assert isinstance(created, SessionCreated)

"""Push notices when no device is connected: a signed webhook the app's backend turns into
an APNs/FCM push (docs/mobile.md).

A phone app in the background keeps no socket; an async tool that completes then reaches
nobody until the app comes back. ``PushObserver`` watches one session's events (see
``gateway.shell.observe``) and, while no socket is attached, hands the ones that want the
user (an async tool's outcome, a confirmation request, a response that starts by itself) to
the gateway's ``Notifier`` as small ``Notice``\\ s: ids, a kind, a short text and the event's
``seq``, never a result. The app resumes and gets the event itself by replay.

The ``Notifier`` POSTs each notice, HMAC-signed, from tasks of its own: a session only
appends to a bounded queue, so a dead or slow receiver costs it nothing. Each notice is
retried with exponential backoff and jitter, at most ``MAX_ATTEMPTS`` times within
``MAX_SECONDS``; past ``MAX_PENDING`` waiting notices, the oldest is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Literal

import httpx
import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter

from gateway.agent.file import Agent, Webhook
from gateway.core.tool import ToolDef, default_display_name
from gateway.wire.v1 import ResponseCreated, ServerMsg, ToolConfirm, ToolStatus

__all__ = [
    "ATTEMPT_TIMEOUT",
    "MAX_ATTEMPTS",
    "MAX_PENDING",
    "MAX_SECONDS",
    "Notice",
    "Notifier",
    "PushObserver",
    "server_tool_lookup",
    "sign",
]

log = structlog.get_logger("gateway.notify")

MAX_ATTEMPTS = 5
"""POSTs of one notice at most (the first and four retries)."""
MAX_SECONDS = 60.0
"""Seconds from a notice's first attempt after which it is given up (a push later than a
minute is news the app gets by itself when the user opens it)."""
ATTEMPT_TIMEOUT = 10.0
"""Seconds one POST may take, connecting included."""
BACKOFF_BASE = 0.5
"""Seconds of the first retry's delay (half of it jitter); doubled at each retry."""
BACKOFF_CAP = 8.0
"""The longest delay between two attempts, unless ``Retry-After`` asks for more (within
``MAX_SECONDS``)."""
MAX_PENDING = 1000
"""Notices waiting for a sender, per gateway; past it the oldest is dropped."""
SENDERS = 8
"""Notices delivered at once, per gateway (each its own task)."""
MAX_TEXT = 200
"""Characters of a notice's ``text`` at most."""

NoticeKind = Literal["tool_result", "confirmation", "response"]
_SETTLED = frozenset({"completed", "failed", "expired"})
"""The statuses of an async call that tell the user something (``cancelled`` does not:
the user or the session did it)."""


class Notice(msgspec.Struct, kw_only=True, frozen=True):
    """The JSON body of one POST: enough to push and to resume, never a result."""

    notice_id: str
    """Unique per notice, the same on its retries: a receiver drops duplicates by it."""
    kind: NoticeKind
    session_id: str
    seq: int
    """The event's ``seq``: resume from ``seq - 1`` (or earlier) to get it by replay."""
    ts: float
    """Unix time the event was sent."""
    text: str
    """A short line for the push (``Lookup order completed``), at most 200 characters."""
    call_id: str | None = None
    response_id: str | None = None
    tool: str | None = None
    status: str | None = None
    """``tool_result`` only: ``completed``, ``failed`` or ``expired``."""


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """``X-Gateway-Signature``: HMAC-SHA256 over ``timestamp``, a dot and the body."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def _short(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


class Notifier:
    """Delivers a gateway's notices to its agent's webhook, off the sessions' tasks.

    Args:
        webhook: where, and the signing key.
        registry: the gateway's metrics registry: ``gateway_notices_total{outcome}``.
        max_attempts, max_seconds, attempt_timeout, backoff: the bounds of one notice's
            delivery (the module's constants by default; tests shrink them).
        max_pending: notices that may wait for a sender; past it the oldest is dropped.
        senders: notices delivered at once.
        transport: httpx's transport (tests).
    """

    def __init__(
        self,
        webhook: Webhook,
        *,
        registry: CollectorRegistry | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        max_seconds: float = MAX_SECONDS,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        backoff: float = BACKOFF_BASE,
        max_pending: int = MAX_PENDING,
        senders: int = SENDERS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._webhook = webhook
        self._max_attempts = max_attempts
        self._max_seconds = max_seconds
        self._attempt_timeout = attempt_timeout
        self._backoff = backoff
        self._max_pending = max_pending
        self._senders = senders
        self._client = httpx.AsyncClient(
            timeout=attempt_timeout, transport=transport, follow_redirects=False
        )
        self._waiting: deque[Notice] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._closed = False
        self.outcomes = Counter(
            "gateway_notices",
            "Push notices by outcome: sent, failed (given up or refused), dropped (queue full).",
            ["outcome"],
            registry=registry,
        )

    def notify(self, notice: Notice) -> None:
        """Queue ``notice`` for delivery; never waits (called on a session's task)."""
        if self._closed:
            return
        if len(self._waiting) >= self._max_pending:
            dropped = self._waiting.popleft()
            log.warning(
                "notify_dropped",
                session_id=dropped.session_id,
                notice_id=dropped.notice_id,
                kind=dropped.kind,
                pending=len(self._waiting),
            )
            self.outcomes.labels("dropped").inc()
        self._waiting.append(notice)
        # Not done: a worker that has just found the queue empty is done at once, though
        # still in the set until its callback runs.
        if sum(not task.done() for task in self._workers) < self._senders:
            # A context of its own: not the session's (its log context names that session).
            task = asyncio.create_task(
                self._work(), name="gateway:notify", context=contextvars.Context()
            )
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def idle(self) -> None:
        """Wait until every queued notice was delivered or given up (tests)."""
        while self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop delivering (notices still queued are lost) and close the HTTP client."""
        self._closed = True
        if self._waiting or self._workers:
            log.info("notify_closing", pending=len(self._waiting), sending=len(self._workers))
        self._waiting.clear()
        for task in list(self._workers):
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self._client.aclose()

    async def _work(self) -> None:
        while self._waiting:
            notice = self._waiting.popleft()
            try:
                await self._deliver(notice)
            except Exception:  # a bug here must not stop the notices after it
                log.exception("notify_crashed", notice_id=notice.notice_id)

    async def _deliver(self, notice: Notice) -> None:
        body = msgspec.json.encode(notice)
        bound = log.bind(
            session_id=notice.session_id,
            notice_id=notice.notice_id,
            kind=notice.kind,
            call_id=notice.call_id,
            response_id=notice.response_id,
        )
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._max_seconds
        reason, attempt = "", 0
        while attempt < self._max_attempts:
            attempt += 1
            left = give_up_at - loop.time()
            if left <= 0:
                break
            asked_wait: float | None = None
            try:
                async with asyncio.timeout(min(self._attempt_timeout, left)):
                    response = await self._post(notice, body)
            except (TimeoutError, httpx.TimeoutException):
                reason = "timeout"
            except httpx.HTTPError as exc:  # refused, reset, DNS...
                reason = type(exc).__name__
            else:
                if response.is_success:
                    bound.info("notify_sent", attempts=attempt, status=response.status_code)
                    self.outcomes.labels("sent").inc()
                    return
                reason = f"HTTP {response.status_code}"
                if response.status_code != 429 and response.status_code < 500:
                    break  # the receiver refuses this notice: sending it again will not help
                asked_wait = _retry_after(response.headers.get("retry-after"))
            if attempt >= self._max_attempts:
                break
            delay = asked_wait if asked_wait is not None else self._delay(attempt)
            if loop.time() + delay >= give_up_at:
                break  # the next attempt would come too late: give up now
            bound.info("notify_retrying", attempt=attempt, reason=reason, delay=round(delay, 3))
            await asyncio.sleep(delay)
        bound.warning("notify_failed", attempts=attempt, reason=reason)
        self.outcomes.labels("failed").inc()

    async def _post(self, notice: Notice, body: bytes) -> httpx.Response:
        # Signed afresh per attempt: the timestamp says when this POST was sent, so a
        # receiver may refuse old ones (a replay) and still accept a late retry.
        timestamp = str(int(time.time()))
        return await self._client.post(
            self._webhook.url,
            content=body,
            headers={
                "Content-Type": "application/json",
                "X-Gateway-Notice-Id": notice.notice_id,
                "X-Gateway-Timestamp": timestamp,
                "X-Gateway-Signature": sign(self._webhook.secret, timestamp, body),
            },
        )

    def _delay(self, attempt: int) -> float:
        """Exponential backoff, half of it jitter (receivers coming back are not hit by
        every gateway at the same instant)."""
        ceiling: float = min(BACKOFF_CAP, self._backoff * 2.0 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


def _retry_after(value: str | None) -> float | None:
    """``Retry-After``'s seconds (a number or an HTTP date), or ``None``."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def server_tool_lookup(agents: Mapping[str, Agent]) -> Callable[[str], ToolDef | None]:
    """Finds a server tool's definition among the agents a session may be with (an async
    tool is always one of theirs: a client declares only sync functions)."""

    def lookup(name: str) -> ToolDef | None:
        for agent in agents.values():
            entry = agent.tools.get(name)
            if entry is not None:
                return entry.definition
        return None

    return lookup


class PushObserver:
    """Turns the events of one session that want the user, sent while no socket is
    attached, into notices (a ``SessionObserver``).

    At most one notice per call and one per response: a ``when_idle`` response that tells
    an async result already notified (its ``call_id``) sends none of its own.

    Args:
        session_id: the session watched.
        notify: takes a notice (the gateway's ``Notifier.notify``).
        tools: a server tool's definition by name (is it async? its display name).
    """

    def __init__(
        self,
        session_id: str,
        notify: Callable[[Notice], None],
        tools: Callable[[str], ToolDef | None],
    ) -> None:
        self._session_id = session_id
        self._notify_one = notify
        self._tools = tools
        self._muted = False
        """No notices now: a socket is attached (the app gets events live), or the session
        is ending. A session starts with none, and notices until its first socket: one
        taken over from another node may have news before its client resumes here."""
        self._notified_calls: set[str] = set()

    def started(self, now: float) -> None:
        pass

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        self._muted = True
        self._notified_calls.clear()  # the app has seen (or replays) those

    def detached(self, *, ended: bool, now: float) -> None:
        # Closed for good (1000): the session ends, nobody will resume to see a notice.
        self._muted = ended

    def ended(self, now: float) -> None:
        self._muted = True  # nobody to resume: nothing more to notify

    def sent(self, msg: ServerMsg, now: float) -> None:
        if self._muted:
            return
        match msg:
            case ToolStatus(status=status, duplicate=False) if status in _SETTLED:
                definition = self._tools(msg.tool)
                if definition is None or definition.execution != "async":
                    return  # a sync call is part of a response the user is waiting for
                if msg.call_id in self._notified_calls:
                    return
                self._notified_calls.add(msg.call_id)
                display = definition.display_name or default_display_name(msg.tool)
                self._notify(
                    msg,
                    now,
                    "tool_result",
                    f"{display} {'completed' if status == 'completed' else status}",
                    call_id=msg.call_id,
                    response_id=msg.response_id,
                    tool=msg.tool,
                    status=status,
                )
            case ToolConfirm(calls=[first, *others]):
                more = f" (+{len(others)} more)" if others else ""
                self._notify(
                    msg,
                    now,
                    "confirmation",
                    _short(first.prompt)[: MAX_TEXT - len(more)] + more,
                    call_id=first.call_id,
                    response_id=msg.response_id,
                    tool=first.tool,
                )
            case ResponseCreated(in_reply_to=None, call_id=call_id):
                # Started by itself (an async result told, a spoken update), not the
                # answer to a message of the user's.
                if call_id is not None and call_id in self._notified_calls:
                    return
                if call_id is not None:
                    self._notified_calls.add(call_id)
                self._notify(
                    msg, now, "response", "New reply", call_id=call_id, response_id=msg.response_id
                )
            case _:
                pass

    def _notify(
        self,
        msg: ServerMsg,
        now: float,
        kind: NoticeKind,
        text: str,
        *,
        call_id: str | None = None,
        response_id: str | None = None,
        tool: str | None = None,
        status: str | None = None,
    ) -> None:
        self._notify_one(
            Notice(
                notice_id=f"ntc_{secrets.token_urlsafe(12)}",
                kind=kind,
                session_id=self._session_id,
                seq=msg.seq,
                ts=now,
                text=_short(text),
                call_id=call_id,
                response_id=response_id,
                tool=tool,
                status=status,
            )
        )

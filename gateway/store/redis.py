"""The ``Store`` on Redis, shared by every gateway node: sessions outlive their node.

Data model. Every key starts with a prefix (``gw:`` by default); a session's keys carry
its id as a hash tag, ``gw:{<session_id>}:<name>``, so a Redis Cluster keeps one session
on one slot and the Lua scripts below may touch them all:

=========  ===========  ================================================================
name       type         holds
=========  ===========  ================================================================
record     string       the ``SessionRecord``, msgpack
state      string       the encoded session state of the last commit that had one
fence      string       the fencing token: INCR at every ``acquire``
owner      string       the node id holding the lease; expires after the lease TTL
log        stream       the event log, one entry ``<seq>-0`` per event, field ``d``
meta       hash         ``size`` (bytes in the log), ``dropped`` (highest seq trimmed
                        away: a replay from before it has a gap), ``last`` (highest seq
                        logged: a repeat is ignored), ``calls`` (save counter),
                        ``holder`` (the node that took the lease last: posts wake it
                        even while its lease lapsed)
calls      hash         call id -> the ``Call``, msgpack
order      sorted set   call ids by their last save (``load_calls`` order)
settled    sorted set   the settled ones, by last save: only ``max_calls`` are kept
inbox      list         events posted for the owner by other nodes (``post``), until
                        the commit that applied them takes them (``posts_taken``)
history    list         the transcript, one encoded item each: a commit drops the oldest
                        and appends the new (``state`` holds the rest of the session)
known      string       "this session existed": ``ended`` is known and no record; it
                        outlives the rest (``ended_ttl``, a day) to tell an expired
                        session from an unknown one
=========  ===========  ================================================================

Named values (``put_named``) are plain strings outside any session,
``gw:named:<name>``, SET with PX (their own TTL).

Expiry. Every write (create, commit, append, save, acquire, renew) sets the TTL of all
the session's keys to ``session_ttl + lease_ttl``: a session whose node died and that no
one resumes disappears by itself, and ``ended`` then says it existed. The owning node
renews its lease more often than that, which keeps an idle live session. ``end_session``
deletes every key but ``known``.

Writes. Each write is one Lua script (``gateway.store.redis_script``, run by EVALSHA through
``register_script`` and loaded again after a Redis restart), so it is atomic and costs
one round trip whatever it carries: ``commit`` appends a batch of events, trims the log
(by count, by bytes), saves the state and the calls under a fence check. Reads of
several keys are MULTI pipelines. The log is trimmed by acks with XTRIM MINID.

Ownership and routing. ``acquire`` increments ``fence`` and sets ``owner`` (PX lease
TTL); ``commit`` and ``renew`` compare the caller's fence with ``fence`` inside the
script. ``post`` appends to ``inbox`` and PUBLISHes the session id on the owner's channel
``gw:node:<node>``, to which ``listen`` subscribes.

Failures. A command that cannot reach Redis raises ``StoreUnavailable`` naming the URL
(never its password). The client retries a command once, on a new connection, when its
connection fails (a pooled connection is dead after a Redis restart); a script whose
answer was lost may so run twice. Every write is idempotent but ``post`` (its event may
be posted twice: the owner applies a call's outcome once, by the call's state) and
``acquire`` (the fence goes up by two; the lease returned is the current one). A timeout
is not retried. A wake published while a listener is reconnecting is lost; the owner
also takes posts when it acquires.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import redis.exceptions
import structlog
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.core.call import Call
from gateway.errors import StoreUnavailable
from gateway.store.base import Lease, LeaseLost, SessionRecord
from gateway.store.redis_script import (
    ACQUIRE,
    COMMIT,
    CREATE,
    KEYS,
    POST,
    PRELUDE,
    RELEASE,
    RENEW,
    TRIM,
)

__all__ = ["RedisStore", "redact"]

log = structlog.get_logger("gateway.redis_store")

_POOL_SIZE = 64
"""Connections a node opens to Redis at most; commands past them wait for one."""
_POOL_TIMEOUT = 5.0
"""Seconds a command waits for a free connection before the store counts as unavailable."""
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
_record = msgspec.msgpack.Decoder(SessionRecord)
_call = msgspec.msgpack.Decoder(Call)
_encode = msgspec.msgpack.Encoder().encode


class RedisStore:
    """A ``Store`` on Redis (the data model is in this module's docstring).

    Args:
        client: a ``redis.asyncio.Redis`` answering bytes (no ``decode_responses``).
        session_ttl: seconds a session's keys live after its last write or renew, plus
            ``lease_ttl``.
        lease_ttl: seconds a lease lasts unless renewed.
        max_events: events kept per session (``replay_max_events``).
        max_size: bytes of events kept per session (``replay_max_size``).
        max_calls: settled calls kept per session for duplicate detection.
        prefix: of every key and channel.
        ended_ttl: seconds an ended or expired session is remembered as such.
        where: the URL to name in errors, without a password.
    """

    def __init__(
        self,
        client: Redis,
        *,
        session_ttl: float,
        lease_ttl: float,
        max_events: int = 10_000,
        max_size: int = 4 * 2**20,
        max_calls: int = 1_000,
        prefix: str = "gw:",
        ended_ttl: float = 86_400.0,
        where: str = "redis",
    ) -> None:
        self._redis = client
        self._ttls = (_ms(session_ttl + lease_ttl), _ms(ended_ttl))
        self._limits = (max_events, max_size, max_calls)
        self._prefix = prefix
        self._where = where
        script = client.register_script
        self._create = script(PRELUDE + CREATE)
        self._commit = script(PRELUDE + COMMIT)
        self._trim = script(PRELUDE + TRIM)
        self._acquire = script(PRELUDE + ACQUIRE)
        self._renew = script(PRELUDE + RENEW)
        self._release = script(PRELUDE + RELEASE)
        self._post = script(PRELUDE + POST)

    @property
    def client(self) -> Redis:
        """The Redis client (the usage ledger shares it: ``gateway.store.ledger_for``)."""
        return self._redis

    @property
    def prefix(self) -> str:
        """The prefix of every key."""
        return self._prefix

    @property
    def where(self) -> str:
        """The URL named in errors, without a password."""
        return self._where

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        session_ttl: float,
        lease_ttl: float,
        max_events: int = 10_000,
        max_size: int = 4 * 2**20,
        max_calls: int = 1_000,
        prefix: str = "gw:",
    ) -> RedisStore:
        """A store on the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``).

        Connects lazily: a wrong address shows at the first command (``ping``).

        Raises:
            ValueError: ``url`` is not a Redis URL.
        """
        pool = BlockingConnectionPool.from_url(
            url,
            # redis-py's pool fails a command at once past 100 connections: a node with
            # more sessions committing at the same moment got store_unavailable. This pool
            # makes a command wait for a free connection instead (up to _POOL_TIMEOUT).
            max_connections=_POOL_SIZE,
            timeout=_POOL_TIMEOUT,
            socket_timeout=5.0,
            socket_connect_timeout=2.0,
            health_check_interval=15,
            # One retry, at once, on a new connection: a pooled one may be dead since Redis
            # restarted. Timeouts are not retried (Redis may be busy running it).
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        )
        client = Redis.from_pool(pool)  # closing the client closes the pool
        return cls(
            client,
            session_ttl=session_ttl,
            lease_ttl=lease_ttl,
            max_events=max_events,
            max_size=max_size,
            max_calls=max_calls,
            prefix=prefix,
            where=redact(url),
        )

    async def create_session(self, record: SessionRecord) -> None:
        await self._run(self._create, record.session_id, _encode(record))

    async def get_session(self, session_id: str) -> SessionRecord | None:
        data = await self._get(self._key(session_id, "record"))
        return None if data is None else _record.decode(data)

    async def end_session(self, session_id: str) -> None:
        keys = self._keys(session_id)
        async with self._pipeline() as pipe:
            pipe.delete(*keys[:-1])
            pipe.set(keys[-1], b"1", px=self._ttls[1])
            await pipe.execute()

    async def ended(self, session_id: str) -> bool:
        async with self._pipeline() as pipe:
            pipe.exists(self._key(session_id, "known"))
            pipe.exists(self._key(session_id, "record"))
            known, live = await pipe.execute()
        return bool(known) and not live

    async def append_event(self, session_id: str, seq: int, data: bytes) -> None:
        await self.commit(session_id, None, state=None, events=[(seq, data)])

    async def events_after(
        self, session_id: str, seq: int, *, lease: Lease | None = None
    ) -> list[bytes] | None:
        async with self._pipeline() as pipe:  # MULTI: the fence as of the read
            pipe.exists(self._key(session_id, "record"))
            pipe.hget(self._key(session_id, "meta"), "dropped")
            pipe.xrange(self._key(session_id, "log"), min=str(max(seq, 0) + 1))
            pipe.get(self._key(session_id, "fence"))
            live, dropped, entries, fence = await pipe.execute()
        if lease is not None and int(fence or 0) != lease.fence:
            raise LeaseLost(f"session {session_id}: lease {lease.fence} was taken over")
        if not live or seq < int(dropped or 0):
            return None
        return [fields[b"d"] for _, fields in entries]

    async def trim_events(self, session_id: str, upto_seq: int) -> None:
        if upto_seq < 1:  # seqs start at 1: nothing to drop (and no valid stream id)
            return
        await self._run(self._trim, session_id, upto_seq)

    async def save_call(self, session_id: str, call: Call) -> None:
        await self.commit(session_id, None, state=None, events=(), calls=[call])

    async def load_calls(self, session_id: str) -> list[Call]:
        async with self._pipeline() as pipe:
            pipe.zrange(self._key(session_id, "order"), 0, -1)
            pipe.hgetall(self._key(session_id, "calls"))
            order, calls = await pipe.execute()
        return [_call.decode(calls[call_id]) for call_id in order if call_id in calls]

    async def ping(self) -> None:
        """Return if Redis answers PING.

        Raises:
            StoreUnavailable: it does not.
        """
        with self._guard():
            await self._redis.ping()

    async def acquire(self, session_id: str, node: str, *, ttl: float) -> Lease:
        fence = await self._run(self._acquire, session_id, node, _ms(ttl))
        return Lease(node, int(fence))

    async def renew(self, session_id: str, lease: Lease, *, ttl: float) -> bool:
        return bool(await self._run(self._renew, session_id, lease.node, _ms(ttl), lease.fence))

    async def renew_many(self, leases: Sequence[tuple[str, Lease]], *, ttl: float) -> list[bool]:
        """``renew`` for many sessions in one pipeline (not a transaction: each is atomic
        by itself): a node renews all its leases in one round trip."""
        if not leases:
            return []
        with self._guard():
            async with self._redis.pipeline(transaction=False) as pipe:
                for session_id, lease in leases:
                    await self._renew(
                        keys=self._keys(session_id),
                        args=[*self._ttls, lease.node, _ms(ttl), lease.fence],
                        client=pipe,
                    )
                return [bool(renewed) for renewed in await pipe.execute()]

    async def release(self, session_id: str, lease: Lease) -> None:
        await self._run(self._release, session_id, lease.fence)

    async def owner(self, session_id: str) -> str | None:
        node = await self._get(self._key(session_id, "owner"))
        return None if node is None else node.decode()

    async def commit(
        self,
        session_id: str,
        lease: Lease | None,
        *,
        state: bytes | None,
        events: Sequence[tuple[int, bytes]],
        calls: Sequence[Call] = (),
        history_drop: int = 0,
        history: Sequence[bytes] = (),
        posts_taken: int = 0,
    ) -> None:
        max_events, max_size, max_calls = self._limits
        args: list[str | int | bytes] = [
            "" if lease is None else lease.fence,
            max_events,
            max_size,
            max_calls,
            0 if state is None else 1,
            b"" if state is None else state,
            len(events),
        ]
        for seq, data in events:
            args += (seq, data)
        args.append(len(calls))
        for call in calls:
            args += (call.call_id, int(call.settled), _encode(call))
        args += (history_drop, len(history), *history, posts_taken)
        if not await self._run(self._commit, session_id, *args):
            assert lease is not None
            raise LeaseLost(f"session {session_id}: lease {lease.fence} was taken over")

    async def load_state(self, session_id: str) -> bytes | None:
        return await self._get(self._key(session_id, "state"))

    async def load_history(self, session_id: str) -> list[bytes]:
        with self._guard():
            items = await self._redis.lrange(self._key(session_id, "history"), 0, -1)
        return [item if isinstance(item, bytes) else item.encode() for item in items]

    async def post(self, session_id: str, data: bytes) -> None:
        await self._run(self._post, session_id, data, self._channel(""), session_id)

    async def read_posts(self, session_id: str) -> list[bytes]:
        with self._guard():
            posts = await self._redis.lrange(self._key(session_id, "inbox"), 0, -1)
        return [post if isinstance(post, bytes) else post.encode() for post in posts]

    def listen(self, node: str, wake: Callable[[str], None]) -> AbstractAsyncContextManager[None]:
        return self._listen(node, wake)

    async def put_named(self, name: str, value: bytes, *, ttl: float) -> None:
        with self._guard():
            await self._redis.set(self._named_key(name), value, px=_ms(ttl))

    async def get_named(self, name: str) -> bytes | None:
        return await self._get(self._named_key(name))

    async def aclose(self) -> None:
        await self._redis.aclose()

    @asynccontextmanager
    async def _listen(self, node: str, wake: Callable[[str], None]) -> AsyncIterator[None]:
        listener = _Listener(self._redis, self._guard, self._channel(node), wake)
        await listener.subscribe()
        task = asyncio.create_task(listener.relay(), name=f"store-listen-{node}")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.wait({task})  # it ends by cancellation; ours is not swallowed
            await listener.aclose()

    async def _get(self, key: str) -> bytes | None:
        with self._guard():
            value = await self._redis.get(key)
        return value.encode() if isinstance(value, str) else value  # str only if decoding

    async def _run(self, script: Any, session_id: str, *args: str | int | bytes) -> Any:
        """Run a write script over all of the session's keys."""
        with self._guard():
            return await script(keys=self._keys(session_id), args=[*self._ttls, *args])

    @asynccontextmanager
    async def _pipeline(self) -> AsyncIterator[Any]:
        with self._guard():
            async with self._redis.pipeline(transaction=True) as pipe:
                yield pipe

    def _guard(self) -> AbstractContextManager[None]:
        return answering("the session store", self._where)

    def _key(self, session_id: str, name: str) -> str:
        return f"{self._prefix}{{{session_id}}}:{name}"

    def _keys(self, session_id: str) -> list[str]:
        return [self._key(session_id, name) for name in KEYS]

    def _named_key(self, name: str) -> str:
        return f"{self._prefix}named:{name}"

    def _channel(self, node: str) -> str:
        return f"{self._prefix}node:{node}"


class _Listener:
    """A subscription to one node's channel that survives Redis restarts."""

    def __init__(
        self,
        client: Redis,
        guard: Callable[[], AbstractContextManager[None]],
        channel: str,
        wake: Callable[[str], None],
    ) -> None:
        self._redis = client
        self._guard = guard
        self._channel = channel
        self._wake = wake
        self._pubsub: PubSub | None = None

    async def subscribe(self) -> None:
        """Subscribe and return once Redis confirmed it: a post after this wakes us.

        Raises:
            StoreUnavailable: Redis does not answer.
        """
        await self.aclose()
        pubsub = self._redis.pubsub()
        self._pubsub = pubsub
        with self._guard():
            await pubsub.subscribe(self._channel)
            async with asyncio.timeout(5.0):
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message and message["type"] == "subscribe":
                        return

    async def relay(self) -> None:
        """Call ``wake`` for every session id published, resubscribing after failures."""
        backoff = 0.05
        while True:
            try:
                if self._pubsub is None:
                    await self.subscribe()
                    log.info("store_listener_resubscribed", channel=self._channel)
                    backoff = 0.05
                assert self._pubsub is not None
                # A timeout, not a blocking read: each call checks the connection's health.
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=1.0
                )
            except (StoreUnavailable, TimeoutError, *_UNREACHABLE) as exc:
                log.warning("store_listener_lost", channel=self._channel, error=str(exc))
                await self.aclose()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if message and message["type"] == "message":
                try:
                    self._wake(bytes(message["data"]).decode())
                except Exception:  # a broken callback must not end the node's routing
                    log.exception("store_wake_failed", channel=self._channel)

    async def aclose(self) -> None:
        """Drop the subscription and its connection."""
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2


def redact(url: str) -> str:
    """``url`` without its password, to name it in errors and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@contextmanager
def answering(what: str, where: str) -> Iterator[None]:
    """Commands to a Redis that cannot be reached raise ``StoreUnavailable`` naming
    ``what`` (the session store, the usage ledger) and ``where`` (no password)."""
    try:
        yield
    except _UNREACHABLE as exc:
        raise StoreUnavailable(
            f"{what} (Redis at {where}) does not answer: {type(exc).__name__}: {exc}"
        ) from exc

"""The usage ledger on Redis, shared by every gateway node (``gateway.store.ledger`` has
the semantics and ``MemoryLedger``, its twin).

Keys, after the store's prefix (``gw:`` by default); a subject or name may hold any
character (keys are binary-safe):

=============================  =======  ================================================
key                            type     holds
=============================  =======  ================================================
``u:w:<subject>``              hash     the 60 s window: ``r:<second>`` requests and
                                        ``t:<second>`` tokens; PEXPIRE 120 s; seconds out
                                        of the window are deleted by ``reserve``
``u:d:<subject>:<YYYYMMDD>``   string   the cost of a UTC day (micro-units); EXPIRE 3 days
``u:m:<subject>:<YYYYMM>``     string   the cost of a UTC month; EXPIRE 35 days
``u:h:<hour start>``           hash     key, end user, agent, model and counter name
                                        joined by ``\\x1f`` -> count; EXPIRE keep_days
=============================  =======  ================================================

``reserve`` and ``settle`` are one Lua script each over all the checks' keys: atomic, so
two nodes racing cannot both take what is left of a limit. Day and month names and their
TTLs are computed here, not in Lua. A refused window returns its buckets, and the
retry_after is worked out by the shared helper (``gateway.store.ledger.refusal``).

The keys of one reservation span subjects: this runs on a single Redis (or a primary with
replicas), not on a Redis Cluster, like the session store's client.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

from redis.asyncio import Redis

from gateway.core.usage import Attribution, Check, Refusal, Reservation, Tally
from gateway.store.ledger import (
    SEPARATOR,
    WINDOW,
    LimitName,
    check_names,
    day_of,
    hour_of,
    hours_between,
    micro,
    month_of,
    refusal,
    sorted_totals,
    windowed,
)
from gateway.store.redis import answering

__all__ = ["RedisLedger"]

_WINDOW_TTL_MS = 2 * WINDOW * 1000
_DAY_TTL = 3 * 86_400
_MONTH_TTL = 35 * 86_400

# KEYS: per check, its window, day and month keys.
# ARGV: second (floor of now), tokens, cost, window TTL ms, day TTL s, month TTL s, then
# per check its requests_per_minute, tokens_per_minute, day cap and month cap in
# micro-units ('' = no such limit).
# Returns {0} when let through, or {check index (1-based), limit name, buckets} when
# refused (buckets: second, amount, second, amount... of the window's, for a rate limit).
RESERVE = """
-- Amounts go to Redis as the ARGV strings: a Lua number of 15+ digits would print as 1e+15.
local now = tonumber(ARGV[1])
local checks = #KEYS / 3
local function limit(i, n)
  local value = ARGV[6 + 4 * (i - 1) + n]
  if value == '' then return nil end
  return tonumber(value)
end
-- The window's live buckets ((now-60, now]) by kind, 'r' and 't'; older ones deleted.
local function window(key)
  local flat = redis.call('HGETALL', key)
  local used, buckets, old = {r = 0, t = 0}, {r = {}, t = {}}, {}
  for j = 1, #flat, 2 do
    local kind, second = string.sub(flat[j], 1, 1), tonumber(string.sub(flat[j], 3))
    if second <= now - 60 then
      old[#old + 1] = flat[j]
    elseif second <= now then  -- a later second is a node with a clock ahead: not yet
      local amount = tonumber(flat[j + 1])
      used[kind] = used[kind] + amount
      table.insert(buckets[kind], second)
      table.insert(buckets[kind], amount)
    end
  end
  if #old > 0 then redis.call('HDEL', key, unpack(old)) end
  return used, buckets
end
for i = 1, checks do
  local rpm, tpm, day, month = limit(i, 1), limit(i, 2), limit(i, 3), limit(i, 4)
  if rpm or tpm then
    local used, buckets = window(KEYS[3 * i - 2])
    if rpm and used.r >= rpm then return {i, 'requests_per_minute', buckets.r} end
    if tpm and used.t >= tpm then return {i, 'tokens_per_minute', buckets.t} end
  end
  if day and tonumber(redis.call('GET', KEYS[3 * i - 1]) or '0') >= day then
    return {i, 'cost_per_day'}
  end
  if month and tonumber(redis.call('GET', KEYS[3 * i]) or '0') >= month then
    return {i, 'cost_per_month'}
  end
end
for i = 1, checks do
  local rpm, tpm, day, month = limit(i, 1), limit(i, 2), limit(i, 3), limit(i, 4)
  if rpm or tpm then
    local key = KEYS[3 * i - 2]
    redis.call('HINCRBY', key, 'r:' .. ARGV[1], 1)
    redis.call('HINCRBY', key, 't:' .. ARGV[1], ARGV[2])
    redis.call('PEXPIRE', key, ARGV[4])
  end
  if day or month then
    redis.call('INCRBY', KEYS[3 * i - 1], ARGV[3])
    redis.call('EXPIRE', KEYS[3 * i - 1], ARGV[5])
    redis.call('INCRBY', KEYS[3 * i], ARGV[3])
    redis.call('EXPIRE', KEYS[3 * i], ARGV[6])
  end
end
return {0}
"""

# KEYS: per check adjusted, its window, day and month keys (of the reservation's time).
# ARGV: second, token difference, cost difference, window TTL ms, day TTL s, month TTL s,
# then per check '1'/'0': its window is adjusted, its day and month are.
# A bucket already gone (out of the window) is not brought back.
SETTLE = """
local field = 't:' .. ARGV[1]
for i = 1, #KEYS / 3 do
  local w, d, m = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if ARGV[6 + 2 * i - 1] == '1' and redis.call('HEXISTS', w, 'r:' .. ARGV[1]) == 1 then
    redis.call('HINCRBY', w, field, ARGV[2])
  end
  if ARGV[6 + 2 * i] == '1' then
    redis.call('INCRBY', d, ARGV[3])
    redis.call('EXPIRE', d, ARGV[5])
    redis.call('INCRBY', m, ARGV[3])
    redis.call('EXPIRE', m, ARGV[6])
  end
end
"""

# KEYS: the hour's key. ARGV: TTL s, then field, amount pairs.
RECORD = """
for j = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[j], ARGV[j + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""


class RedisLedger:
    """A ``Ledger`` on Redis (the keys are in this module's docstring).

    Args:
        client: a ``redis.asyncio.Redis`` answering bytes (the ``RedisStore``'s).
        prefix: of every key (the store's).
        keep_days: days the hourly usage is kept.
        where: the URL to name in errors, without a password.
    """

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "gw:",
        keep_days: float = 400,
        where: str = "redis",
    ) -> None:
        self._redis = client
        self._prefix = prefix
        self._keep = max(1, math.ceil(keep_days * 86_400))
        self._where = where
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)
        self._record = client.register_script(RECORD)

    async def reserve(
        self, checks: Sequence[Check], *, tokens: int, cost: int, now: float
    ) -> Reservation | Refusal:
        metered = [check for check in checks if check.limits.metered]
        if metered:
            keys: list[str] = []
            args: list[str | int] = [
                *(math.floor(now), tokens, cost),
                *(_WINDOW_TTL_MS, _DAY_TTL, _MONTH_TTL),
            ]
            for check in metered:
                keys += self._subject_keys(check.subject, now)
                limits = check.limits
                args += (
                    _arg(limits.requests_per_minute),
                    _arg(limits.tokens_per_minute),
                    _arg(None if limits.cost_per_day is None else micro(limits.cost_per_day)),
                    _arg(None if limits.cost_per_month is None else micro(limits.cost_per_month)),
                )
            with self._guard():
                answer = await self._reserve(keys=keys, args=args)
            if answer[0] != 0:
                index, limit = int(answer[0]), _text(answer[1])
                flat = [int(n) for n in answer[2]] if len(answer) > 2 else []
                buckets = list(zip(flat[::2], flat[1::2], strict=True))
                return refusal(metered[index - 1], cast(LimitName, limit), now, buckets)
        return Reservation(at=now, checks=tuple(checks), tokens=tokens, cost=cost)

    async def settle(self, reservation: Reservation, *, tokens: int, cost: int) -> None:
        extra_tokens, extra_cost = tokens - reservation.tokens, cost - reservation.cost
        keys: list[str] = []
        args: list[str | int] = [
            *(math.floor(reservation.at), extra_tokens, extra_cost),
            *(_WINDOW_TTL_MS, _DAY_TTL, _MONTH_TTL),
        ]
        for check in reservation.checks:
            window = bool(extra_tokens) and windowed(check)
            costed = bool(extra_cost) and check.limits.costed
            if window or costed:
                keys += self._subject_keys(check.subject, reservation.at)
                args += (int(window), int(costed))
        if keys:
            with self._guard():
                await self._settle(keys=keys, args=args)

    async def record(self, who: Attribution, tally: Tally, *, now: float) -> None:
        counters = check_names(who, tally)
        if not counters:
            return
        names = SEPARATOR.join((who.key, who.end_user, who.agent, who.model))
        args: list[str | int] = [self._keep]
        for name, value in counters.items():
            args += (f"{names}{SEPARATOR}{name}", value)
        with self._guard():
            await self._record(keys=[self._hour_key(hour_of(now))], args=args)

    async def totals(
        self, *, start: float, end: float, key: str | None = None
    ) -> list[tuple[Attribution, Tally]]:
        hours = hours_between(start, end)
        if not hours:
            return []
        with self._guard():
            async with self._redis.pipeline(transaction=False) as pipe:
                for hour in hours:
                    pipe.hgetall(self._hour_key(hour))
                answers: list[dict[bytes, bytes]] = await pipe.execute()
        sums: dict[Attribution, dict[str, int]] = {}
        for fields in answers:
            for field, value in fields.items():
                parts = _text(field).split(SEPARATOR)
                if len(parts) != 5 or (key is not None and parts[0] != key):
                    continue  # not a field this version writes
                counters = sums.setdefault(Attribution(*parts[:4]), {})
                counters[parts[4]] = counters.get(parts[4], 0) + int(value)
        return sorted_totals(sums)

    async def window(self, subject: str, *, now: float) -> tuple[int, int]:
        with self._guard():
            fields: dict[Any, Any] = await self._redis.hgetall(self._subject_keys(subject, now)[0])
        used = {"r": 0, "t": 0}
        for field, value in fields.items():
            kind, _, second = _text(field).partition(":")
            if now - WINDOW < int(second) <= now:
                used[kind] += int(value)
        return used["t"], used["r"]

    async def spent(self, subject: str, *, now: float) -> tuple[int, int]:
        with self._guard():
            day, month = await self._redis.mget(self._subject_keys(subject, now)[1:])
        return int(day or 0), int(month or 0)

    def _subject_keys(self, subject: str, now: float) -> tuple[str, str, str]:
        """``subject``'s window key, and its keys of the day and month of ``now``."""
        p = self._prefix
        return (
            f"{p}u:w:{subject}",
            f"{p}u:d:{subject}:{day_of(now)[0]}",
            f"{p}u:m:{subject}:{month_of(now)[0]}",
        )

    def _hour_key(self, hour: int) -> str:
        return f"{self._prefix}u:h:{hour}"

    def _guard(self) -> AbstractContextManager[None]:
        return answering("the usage ledger", self._where)


def _arg(limit: int | None) -> str | int:
    return "" if limit is None else limit


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

"""The usage ledger: reservations against limits before each model step, usage after.

``Ledger`` is the interface, ``MemoryLedger`` one node's ledger in memory and
``RedisLedger`` (``gateway.store.ledger_redis``) the one every node shares; both have the
same semantics (tests/test_ledger.py runs against both). The values they deal in
(``Check``, ``Reservation``, ``Refusal``, ``Tally``...) are ``gateway.core.usage``'s.

What is counted, per subject (``key:NAME``, ``key:NAME/user:ID``, ``agent:NAME``):

- a sliding window of the last 60 s in buckets of one second: requests (reservations)
  and tokens (reserved estimates, adjusted by settles). Bucket second ``b`` counts while
  ``now - 60 < b <= now``;
- the cost (micro-units) of each UTC day and each UTC month, reserved plus settled.

Usage for reading later (``record``, ``totals``) is kept per attribution and UTC hour.

Admission is "something is left" (used < limit): with atomic reservations a limit is
exceeded by at most one step's estimate (plus what real usage exceeds its estimate).
The helpers here (window, day and month arithmetic, the refusal) are shared by both
ledgers, so their answers agree to the millisecond.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from gateway.core.usage import MICRO, Attribution, Check, Refusal, Reservation, Tally

__all__ = [
    "HOUR",
    "MAX_RANGE",
    "SEPARATOR",
    "WINDOW",
    "Ledger",
    "LimitName",
    "MemoryLedger",
    "check_names",
    "day_of",
    "hour_of",
    "hours_between",
    "micro",
    "month_of",
    "refusal",
    "sorted_totals",
    "window_retry",
    "windowed",
]

WINDOW = 60
"""Seconds in the rate limits' sliding window."""
MAX_RANGE = 93 * 86_400.0
"""The longest range ``totals`` reads (a quarter): a longer one is a caller's mistake."""
HOUR = 3_600
_DAY = 86_400
SEPARATOR = "\x1f"
"""Joins the attribution and counter names in a Redis hash field: no name may hold it."""
_MIN_RETRY = 0.001
"""A retry_after is never 0: "now" would be refused again by the same bucket."""

LimitName = Literal["requests_per_minute", "tokens_per_minute", "cost_per_day", "cost_per_month"]


class Ledger(Protocol):
    """Where reservations and usage are counted (per node in memory, shared on Redis).

    ``now`` is Unix seconds (``time.time()``), given by the caller: tests pass a fake one.
    A Redis ledger raises ``StoreUnavailable`` from every method when Redis does not answer.
    """

    async def reserve(
        self, checks: Sequence[Check], *, tokens: int, cost: int, now: float
    ) -> Reservation | Refusal:
        """Reserve one model step of about ``tokens`` and ``cost`` (micro-units) against
        every check, all or nothing: the first limit it would go over, or the reservation
        (a request and ``tokens`` in each window, ``cost`` on each day and month)."""
        ...

    async def settle(self, reservation: Reservation, *, tokens: int, cost: int) -> None:
        """The step's real usage: its window bucket, day and month move by the difference
        with the estimate (a bucket already out of the window is left alone)."""
        ...

    async def record(self, who: Attribution, tally: Tally, *, now: float) -> None:
        """Add ``tally`` to ``who``'s usage in the UTC hour of ``now``.

        Raises:
            ValueError: a name of ``who`` or a tool kind holds ``\\x1f`` (the separator).
        """
        ...

    async def totals(
        self, *, start: float, end: float, key: str | None = None
    ) -> list[tuple[Attribution, Tally]]:
        """The usage of the hours starting in ``[start, end)`` (``start``'s hour included),
        per attribution, only ``key``'s if given, sorted by (key, end user, agent, model).

        Raises:
            ValueError: the range is longer than 93 days.
        """
        ...

    async def window(self, subject: str, *, now: float) -> tuple[int, int]:
        """``(tokens, requests)`` of ``subject`` in the last 60 s."""
        ...

    async def spent(self, subject: str, *, now: float) -> tuple[int, int]:
        """``(cost of the UTC day, cost of the UTC month)`` of ``subject``, micro-units."""
        ...


# ------------------------------------------------------------------- shared arithmetic


def micro(amount: float) -> int:
    """A limit in the price table's currency, in micro-units (rounded: a fraction of a
    micro-unit is float noise, ``0.07 * MICRO`` is ``70000.00000000001``)."""
    return round(amount * MICRO)


def day_of(now: float) -> tuple[str, float]:
    """The UTC day of ``now`` as ``YYYYMMDD`` and the seconds left until its midnight."""
    return time.strftime("%Y%m%d", time.gmtime(now)), (math.floor(now / _DAY) + 1) * _DAY - now


def month_of(now: float) -> tuple[str, float]:
    """The UTC month of ``now`` as ``YYYYMM`` and the seconds left until the next one."""
    moment = time.gmtime(now)
    year, month = moment.tm_year, moment.tm_mon
    following = (year + 1, 1) if month == 12 else (year, month + 1)
    start = calendar.timegm((*following, 1, 0, 0, 0))
    return f"{year:04d}{month:02d}", start - now


def window_retry(buckets: Iterable[tuple[int, int]], limit: int, now: float) -> float:
    """Seconds until enough of the window's oldest usage has left it for the rest to be
    under ``limit``. ``buckets``: ``(second, amount)`` of the seconds in the window.

    Bucket second ``b`` leaves the window at ``b + 60``. A limit of 0 is never under:
    the answer is then the window's length (try again once the limits may have changed).
    """
    ordered = sorted(buckets)
    used = sum(amount for _, amount in ordered)
    for second, amount in ordered:
        used -= amount
        if used < limit:
            return max(second + WINDOW - now, _MIN_RETRY)
    return float(WINDOW)


def refusal(
    check: Check, limit: LimitName, now: float, buckets: Iterable[tuple[int, int]] = ()
) -> Refusal:
    """The refusal of ``check``'s ``limit`` at ``now`` (``buckets``: the window's, for a
    rate limit)."""
    value: float | int | None = getattr(check.limits, limit)
    assert value is not None
    if limit == "cost_per_day":
        retry_after = day_of(now)[1]
    elif limit == "cost_per_month":
        retry_after = month_of(now)[1]
    else:
        retry_after = window_retry(buckets, int(value), now)
    return Refusal(
        code="budget_exceeded" if limit.startswith("cost") else "rate_limited",
        scope=check.scope,
        subject=check.subject,
        limit=limit,
        value=value,
        retry_after=retry_after,
    )


def windowed(check: Check) -> bool:
    """Whether ``check`` has a rate limit (a window to count in)."""
    return (
        check.limits.requests_per_minute is not None or check.limits.tokens_per_minute is not None
    )


def hours_between(start: float, end: float) -> range:
    """The starts of the hours ``totals`` reads: ``start``'s hour up to, not including,
    ``end``.

    Raises:
        ValueError: the range is longer than ``MAX_RANGE``.
    """
    if end - start > MAX_RANGE:
        raise ValueError(
            f"usage totals: a range of at most 93 days is read at once, got "
            f"{(end - start) / _DAY:.1f} days (read it in parts)"
        )
    first = math.floor(start / HOUR) * HOUR
    return range(first, math.ceil(end), HOUR)


def hour_of(now: float) -> int:
    """The start of the UTC hour of ``now``."""
    return math.floor(now / HOUR) * HOUR


def check_names(who: Attribution, tally: Tally) -> dict[str, int]:
    """``tally``'s counters, once ``who`` and the counter names are known to be free of
    the separator of the Redis fields (kept the same in memory: one contract).

    Raises:
        ValueError: a name holds ``\\x1f``.
    """
    counters = tally.counters()
    for name in (who.key, who.end_user, who.agent, who.model, *counters):
        if SEPARATOR in name:
            raise ValueError(f"usage record: a name holds the separator \\x1f: {name!r}")
    return counters


def sorted_totals(sums: dict[Attribution, dict[str, int]]) -> list[tuple[Attribution, Tally]]:
    """``(attribution, tally)`` of the ones with something counted, in report order."""
    return [
        (who, Tally.from_counters(counters))
        for who, counters in sorted(
            sums.items(),
            key=lambda item: (item[0].key, item[0].end_user, item[0].agent, item[0].model),
        )
        if any(counters.values())
    ]


# ----------------------------------------------------------------------- in memory


class MemoryLedger:
    """A ``Ledger`` in this process's memory: one node's limits and usage.

    Args:
        keep_days: days the hourly usage is kept (older hours are dropped on write).
    """

    def __init__(self, *, keep_days: float = 400) -> None:
        self._keep = keep_days * _DAY
        self._windows: dict[str, dict[int, list[int]]] = {}
        """subject -> second -> [tokens, requests]."""
        self._days: dict[tuple[str, str], int] = {}
        """(subject, YYYYMMDD) -> cost."""
        self._months: dict[tuple[str, str], int] = {}
        """(subject, YYYYMM) -> cost."""
        self._hours: dict[int, dict[Attribution, dict[str, int]]] = {}
        self._oldest_hour: int | None = None
        """No hour kept is older (a lower bound): the hours are walked only when it is due."""
        self._next_sweep = 0.0

    async def reserve(
        self, checks: Sequence[Check], *, tokens: int, cost: int, now: float
    ) -> Reservation | Refusal:
        if now >= self._next_sweep:
            self._sweep(now)
        second = math.floor(now)
        for check in checks:
            if not check.limits.metered:
                continue
            refused = self._refusal(check, now)
            if refused is not None:
                return refused
        for check in checks:
            if windowed(check):
                bucket = self._windows.setdefault(check.subject, {}).setdefault(second, [0, 0])
                bucket[0] += tokens
                bucket[1] += 1
            if check.limits.costed:
                self._add_cost(check.subject, now, cost)
        return Reservation(at=now, checks=tuple(checks), tokens=tokens, cost=cost)

    async def settle(self, reservation: Reservation, *, tokens: int, cost: int) -> None:
        extra_tokens, extra_cost = tokens - reservation.tokens, cost - reservation.cost
        second = math.floor(reservation.at)
        for check in reservation.checks:
            if extra_tokens and windowed(check):
                # Only a bucket still kept: one swept away stays away.
                bucket = self._windows.get(check.subject, {}).get(second)
                if bucket is not None:
                    bucket[0] += extra_tokens
            if extra_cost and check.limits.costed:
                self._add_cost(check.subject, reservation.at, extra_cost)

    async def record(self, who: Attribution, tally: Tally, *, now: float) -> None:
        counters = check_names(who, tally)
        if not counters:
            return
        hour = hour_of(now)
        sums = self._hours.setdefault(hour, {}).setdefault(who, {})
        for name, value in counters.items():
            sums[name] = sums.get(name, 0) + value
        horizon = now - self._keep
        if self._oldest_hour is None or hour < self._oldest_hour:
            self._oldest_hour = hour
        if self._oldest_hour < horizon:
            for old in [h for h in self._hours if h < horizon]:
                del self._hours[old]
            self._oldest_hour = min(self._hours, default=None)

    async def totals(
        self, *, start: float, end: float, key: str | None = None
    ) -> list[tuple[Attribution, Tally]]:
        sums: dict[Attribution, dict[str, int]] = {}
        for hour in hours_between(start, end):
            for who, counters in self._hours.get(hour, {}).items():
                if key is not None and who.key != key:
                    continue
                total = sums.setdefault(who, {})
                for name, value in counters.items():
                    total[name] = total.get(name, 0) + value
        return sorted_totals(sums)

    async def window(self, subject: str, *, now: float) -> tuple[int, int]:
        tokens = requests = 0
        for second, (spent, started) in self._windows.get(subject, {}).items():
            if now - WINDOW < second <= now:
                tokens += spent
                requests += started
        return tokens, requests

    async def spent(self, subject: str, *, now: float) -> tuple[int, int]:
        return (
            self._days.get((subject, day_of(now)[0]), 0),
            self._months.get((subject, month_of(now)[0]), 0),
        )

    def _refusal(self, check: Check, now: float) -> Refusal | None:
        limits = check.limits
        if windowed(check):
            buckets = self._windows.get(check.subject, {})
            for old in [second for second in buckets if second <= now - WINDOW]:
                del buckets[old]
            live = [(s, b) for s, b in buckets.items() if s <= now]  # a later clock's: not yet
            rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
            if rpm is not None and sum(b[1] for _, b in live) >= rpm:
                return refusal(check, "requests_per_minute", now, [(s, b[1]) for s, b in live])
            if tpm is not None and sum(b[0] for _, b in live) >= tpm:
                return refusal(check, "tokens_per_minute", now, [(s, b[0]) for s, b in live])
        day, month = self._cost(check.subject, now)
        if limits.cost_per_day is not None and day >= micro(limits.cost_per_day):
            return refusal(check, "cost_per_day", now)
        if limits.cost_per_month is not None and month >= micro(limits.cost_per_month):
            return refusal(check, "cost_per_month", now)
        return None

    def _cost(self, subject: str, now: float) -> tuple[int, int]:
        return (
            self._days.get((subject, day_of(now)[0]), 0),
            self._months.get((subject, month_of(now)[0]), 0),
        )

    def _add_cost(self, subject: str, at: float, cost: int) -> None:
        day, month = (subject, day_of(at)[0]), (subject, month_of(at)[0])
        self._days[day] = self._days.get(day, 0) + cost
        self._months[month] = self._months.get(month, 0) + cost

    def _sweep(self, now: float) -> None:
        """Drop what no longer counts, once a minute: the windows of subjects not seen
        since, the days before yesterday and the months before the last (a step that
        straddles midnight settles on the day it started)."""
        self._next_sweep = now + WINDOW
        for subject, buckets in list(self._windows.items()):
            for old in [second for second in buckets if second <= now - WINDOW]:
                del buckets[old]
            if not buckets:
                del self._windows[subject]
        days = {day_of(now)[0], day_of(now - _DAY)[0]}
        self._days = {entry: cost for entry, cost in self._days.items() if entry[1] in days}
        last_month = now - time.gmtime(now).tm_mday * _DAY  # a day of the month before
        months = {month_of(now)[0], month_of(last_month)[0]}
        self._months = {entry: cost for entry, cost in self._months.items() if entry[1] in months}

"""One contract for every usage ``Ledger``: MemoryLedger and RedisLedger (on a real
redis-server, through ``ledger_for`` and a ``RedisStore``).

Each test runs against both. Time is a fake ``now`` passed in: windows slide, days and
months end, without a sleep.
"""

from __future__ import annotations

import asyncio
import calendar
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import pytest

from gateway.core.usage import (
    MICRO,
    Attribution,
    Check,
    Limits,
    Refusal,
    Reservation,
    Scope,
    Tally,
)
from gateway.errors import StoreUnavailable
from gateway.store import Ledger, MemoryLedger, MemoryStore, Store, ledger_for
from gateway.store.ledger import day_of, month_of, window_retry
from tests.redis_server import RedisServer, redis_server

NOON = calendar.timegm((2026, 3, 31, 12, 0, 0)) + 0.25
"""A fake now: noon of the last day of a month, a quarter of a second in."""
KEY = "key:acme"


class MakeLedger(Protocol):
    def __call__(self) -> Ledger: ...


@pytest.fixture(scope="session")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis-ledger")) as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def make_ledger(request: pytest.FixtureRequest) -> AsyncIterator[MakeLedger]:
    """Ledgers of "nodes" that count in one place: one shared MemoryLedger, or a
    RedisLedger per node on one redis-server (each with a client of its own)."""
    stores: list[Store] = []
    shared = MemoryLedger()
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        server.flushall()

    def make() -> Ledger:
        if request.param == "memory":
            return shared
        from gateway.store.redis import RedisStore

        store = RedisStore.from_url(server.url, session_ttl=60, lease_ttl=10)
        stores.append(store)
        return ledger_for(store)

    yield make
    for store in stores:
        await store.aclose()


@pytest.fixture
def ledger(make_ledger: MakeLedger) -> Ledger:
    return make_ledger()


def check(subject: str = KEY, scope: Scope = "key", **limits: Any) -> Check:
    return Check(scope, subject, Limits(**limits))


def refused(outcome: Reservation | Refusal) -> Refusal:
    assert isinstance(outcome, Refusal), outcome
    return outcome


def reserved(outcome: Reservation | Refusal) -> Reservation:
    assert isinstance(outcome, Reservation), outcome
    return outcome


# Rate limits: the sliding window.


async def test_requests_per_minute_refuses_at_the_limit_until_the_window_moves(
    ledger: Ledger,
) -> None:
    rpm = check(requests_per_minute=3)
    for at in (NOON, NOON + 10, NOON + 10.5):  # seconds 0, 10, 10 of the window
        reserved(await ledger.reserve([rpm], tokens=5, cost=0, now=at))
    assert await ledger.window(KEY, now=NOON + 20) == (15, 3)
    refusal = refused(await ledger.reserve([rpm], tokens=5, cost=0, now=NOON + 20))
    assert refusal == Refusal(
        code="rate_limited",
        scope="key",
        subject=KEY,
        limit="requests_per_minute",
        value=3,
        retry_after=39.75,  # the oldest, second NOON-0.25, leaves at +59.75
    )
    # Just before the oldest request leaves: still refused, and nothing was counted.
    refused(await ledger.reserve([rpm], tokens=5, cost=0, now=NOON + 59.7))
    assert await ledger.window(KEY, now=NOON + 59.7) == (15, 3)
    # Once it left, one more goes through; the two of second 10 then hold it until 70.
    reserved(await ledger.reserve([rpm], tokens=5, cost=0, now=NOON + 59.8))
    again = refused(await ledger.reserve([rpm], tokens=5, cost=0, now=NOON + 60))
    assert again.retry_after == pytest.approx(9.75)  # second NOON+9.75 leaves at +69.75


async def test_tokens_per_minute_refuses_once_the_window_is_full_and_waits_for_enough(
    ledger: Ledger,
) -> None:
    tpm = check(subject="agent:bot", scope="agent", tokens_per_minute=1000)
    reserved(await ledger.reserve([tpm], tokens=400, cost=0, now=NOON))
    reserved(await ledger.reserve([tpm], tokens=400, cost=0, now=NOON + 5))
    reserved(await ledger.reserve([tpm], tokens=400, cost=0, now=NOON + 6))  # 800 < 1000
    refusal = refused(await ledger.reserve([tpm], tokens=1, cost=0, now=NOON + 7))
    assert (refusal.code, refusal.scope, refusal.limit, refusal.value) == (
        "rate_limited",
        "agent",
        "tokens_per_minute",
        1000,
    )
    # 1200 used: the first 400 leaving brings it to 800 < 1000, at its second + 60.
    assert refusal.retry_after == pytest.approx(NOON - 0.25 + 60 - (NOON + 7))
    assert await ledger.window("agent:bot", now=NOON + 7) == (1200, 3)
    reserved(await ledger.reserve([tpm], tokens=1, cost=0, now=NOON + 59.75))
    assert await ledger.window("agent:bot", now=NOON + 59.75) == (801, 3)


def test_window_retry_takes_the_oldest_buckets_until_under_the_limit() -> None:
    buckets = [(110, 5), (100, 5), (105, 5)]
    assert window_retry(buckets, 15, now=120.5) == pytest.approx(160 - 120.5)
    assert window_retry(buckets, 6, now=120.5) == pytest.approx(165 - 120.5)
    assert window_retry(buckets, 5, now=120.5) == pytest.approx(170 - 120.5)
    assert window_retry([(100, 5)], 1, now=160.0) == 0.001  # never 0
    assert window_retry([], 0, now=1.0) == 60.0  # a limit of 0: never under


# Settling: the real usage.


async def test_settle_moves_the_window_and_the_day_by_the_difference(ledger: Ledger) -> None:
    both = check(tokens_per_minute=1000, cost_per_day=1.0)
    first = reserved(await ledger.reserve([both], tokens=500, cost=300_000, now=NOON))
    second = reserved(await ledger.reserve([both], tokens=400, cost=200_000, now=NOON + 1))
    assert await ledger.window(KEY, now=NOON + 2) == (900, 2)
    assert await ledger.spent(KEY, now=NOON + 2) == (500_000, 500_000)
    await ledger.settle(first, tokens=700, cost=650_000)  # more than estimated
    await ledger.settle(second, tokens=100, cost=50_000)  # less
    assert await ledger.window(KEY, now=NOON + 2) == (800, 2)
    assert await ledger.spent(KEY, now=NOON + 2) == (700_000, 700_000)
    await ledger.settle(second, tokens=400, cost=200_000)  # the estimate: no change
    # The window moved: 700 of the first bucket is no longer there.
    assert await ledger.window(KEY, now=NOON + 60) == (100, 1)
    # A reservation drops the buckets out of the window; a late settle does not bring
    # them back (seen from an earlier now, where it would count again).
    reserved(await ledger.reserve([both], tokens=10, cost=0, now=NOON + 60.5))
    await ledger.settle(first, tokens=5_700, cost=650_000)
    assert await ledger.window(KEY, now=NOON + 60.5) == (110, 2)
    assert await ledger.window(KEY, now=NOON + 0.5) == (0, 0)
    assert await ledger.spent(KEY, now=NOON + 61) == (1_050_000, 1_050_000)
    # Over budget now (settled past the cap): refused, with the day's retry_after.
    refusal = refused(await ledger.reserve([both], tokens=1, cost=1, now=NOON + 62))
    assert refusal.limit == "cost_per_day"


async def test_a_settle_lands_on_the_day_of_its_reservation(ledger: Ledger) -> None:
    daily = check(cost_per_day=10.0)
    before = calendar.timegm((2026, 3, 30, 23, 59, 59)) + 0.5
    late = reserved(await ledger.reserve([daily], tokens=0, cost=1_000, now=before))
    await ledger.settle(late, tokens=0, cost=3_000)
    assert await ledger.spent(KEY, now=before) == (3_000, 3_000)
    assert await ledger.spent(KEY, now=before + 1) == (0, 3_000)  # a new day, same month


# Budgets: the UTC day and month.


async def test_a_day_cap_refuses_until_midnight_and_a_new_day_lets_through(ledger: Ledger) -> None:
    daily = check(subject="key:acme/user:u1", scope="end_user", cost_per_day=0.5)
    for _ in range(2):
        reserved(await ledger.reserve([daily], tokens=0, cost=300_000, now=NOON))
    refusal = refused(await ledger.reserve([daily], tokens=0, cost=1, now=NOON + 1))
    assert refusal == Refusal(
        code="budget_exceeded",
        scope="end_user",
        subject="key:acme/user:u1",
        limit="cost_per_day",
        value=0.5,
        retry_after=12 * 3600 - 1.25,
    )
    midnight = calendar.timegm((2026, 4, 1, 0, 0, 0))
    refused(await ledger.reserve([daily], tokens=0, cost=1, now=midnight - 0.001))
    reserved(await ledger.reserve([daily], tokens=0, cost=1, now=midnight))
    assert await ledger.spent("key:acme/user:u1", now=midnight) == (1, 1)


async def test_a_month_cap_refuses_until_the_next_month(ledger: Ledger) -> None:
    monthly = check(cost_per_month=2.0, cost_per_day=100.0)
    first_day = calendar.timegm((2026, 3, 1, 8, 0, 0))
    reserved(await ledger.reserve([monthly], tokens=0, cost=1_500_000, now=first_day))
    reserved(await ledger.reserve([monthly], tokens=0, cost=1_500_000, now=NOON))
    refusal = refused(await ledger.reserve([monthly], tokens=0, cost=1, now=NOON))
    assert (refusal.code, refusal.limit, refusal.value) == ("budget_exceeded", "cost_per_month", 2)
    april = calendar.timegm((2026, 4, 1, 0, 0, 0))
    assert refusal.retry_after == pytest.approx(april - NOON)
    assert await ledger.spent(KEY, now=NOON) == (1_500_000, 3_000_000)
    reserved(await ledger.reserve([monthly], tokens=0, cost=7, now=april + 0.5))
    assert await ledger.spent(KEY, now=april + 0.5) == (7, 7)


def test_day_and_month_arithmetic_is_utc_and_crosses_the_year() -> None:
    new_year = calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert day_of(new_year - 0.5) == ("20261231", 0.5)
    assert month_of(new_year - 0.5) == ("202612", 0.5)
    assert month_of(new_year) == ("202701", 31 * 86_400)
    assert day_of(calendar.timegm((2028, 2, 29, 6, 0, 0)))[0] == "20280229"


# All or nothing, and what is not counted.


async def test_a_refusal_on_the_third_check_leaves_the_first_two_untouched(ledger: Ledger) -> None:
    checks = [
        check(requests_per_minute=10, tokens_per_minute=1000, cost_per_day=5.0),
        check("key:acme/user:u1", "end_user", requests_per_minute=10, cost_per_month=5.0),
        check("agent:bot", "agent", requests_per_minute=1),
    ]
    reserved(await ledger.reserve(checks[2:], tokens=50, cost=10, now=NOON))  # fills agent's
    refusal = refused(await ledger.reserve(checks, tokens=50, cost=10, now=NOON + 1))
    assert (refusal.subject, refusal.limit) == ("agent:bot", "requests_per_minute")
    assert refusal.retry_after == pytest.approx(59.75 - 1)
    for subject in (KEY, "key:acme/user:u1"):
        assert await ledger.window(subject, now=NOON + 1) == (0, 0)
        assert await ledger.spent(subject, now=NOON + 1) == (0, 0)
    assert await ledger.spent("agent:bot", now=NOON + 1) == (0, 0)  # no cost limit: no cost
    # Once through, every check with a limit counts it (the window or the cost it limits).
    outcome = reserved(await ledger.reserve(checks, tokens=50, cost=10, now=NOON + 60))
    assert outcome == Reservation(at=NOON + 60, checks=tuple(checks), tokens=50, cost=10)
    assert await ledger.window(KEY, now=NOON + 60) == (50, 1)
    assert await ledger.spent(KEY, now=NOON + 60) == (10, 10)
    assert await ledger.spent("key:acme/user:u1", now=NOON + 60) == (10, 10)
    assert await ledger.window("agent:bot", now=NOON + 60) == (50, 1)


async def test_no_checks_or_no_limits_reserve_and_count_nothing(ledger: Ledger) -> None:
    assert await ledger.reserve([], tokens=5, cost=5, now=NOON) == Reservation(
        at=NOON, checks=(), tokens=5, cost=5
    )
    open_check = check(concurrent_sessions=3)  # no limit a step is held to
    outcome = reserved(await ledger.reserve([open_check], tokens=5, cost=5, now=NOON))
    assert outcome.checks == (open_check,)
    await ledger.settle(outcome, tokens=50, cost=50)
    assert await ledger.window(KEY, now=NOON) == (0, 0)
    assert await ledger.spent(KEY, now=NOON) == (0, 0)


async def test_a_limit_of_zero_refuses_everything(ledger: Ledger) -> None:
    for limits, code, retry in (
        ({"requests_per_minute": 0}, "rate_limited", 60.0),
        ({"tokens_per_minute": 0}, "rate_limited", 60.0),
        ({"cost_per_day": 0}, "budget_exceeded", 12 * 3600 - 0.25),
        ({"cost_per_month": 0.0}, "budget_exceeded", 12 * 3600 - 0.25),
    ):
        refusal = refused(await ledger.reserve([check(**limits)], tokens=0, cost=0, now=NOON))
        assert (refusal.code, refusal.value, refusal.retry_after) == (code, 0, retry)
    assert await ledger.window(KEY, now=NOON) == (0, 0)
    assert await ledger.spent(KEY, now=NOON) == (0, 0)


async def test_subjects_with_odd_characters_are_kept_apart(ledger: Ledger) -> None:
    subjects = [
        "key:a:b/user:c d",
        "key:a:b/user:c",
        "key:a:b",
        "agent:ünï cødé 🎧",
        "key:{tag}/user:*?[x]",
        "key:\x1f:\n",
    ]
    for n, subject in enumerate(subjects, start=1):
        limited = check(subject, requests_per_minute=n, cost_per_day=1.0)
        for _ in range(n):
            reserved(await ledger.reserve([limited], tokens=n, cost=n, now=NOON))
        refused(await ledger.reserve([limited], tokens=n, cost=n, now=NOON))
    for n, subject in enumerate(subjects, start=1):
        assert await ledger.window(subject, now=NOON) == (n * n, n)
        assert await ledger.spent(subject, now=NOON) == (n * n, n * n)


# Usage for reading later: record and totals.


def tally(steps: int, cost: int = 0, **tools: int) -> Tally:
    return Tally(
        steps=steps, input_tokens=10 * steps, output_tokens=steps, cost=cost, tool_calls=tools
    )


async def test_record_and_totals_sum_per_attribution_over_the_hours(ledger: Ledger) -> None:
    hour = calendar.timegm((2026, 3, 31, 9, 0, 0))
    web = Attribution("key:acme", "u1", "bot", "gpt-x")
    anon = Attribution("key:acme", "", "bot", "gpt-x")
    other = Attribution("key:beta", "u1", "bot", "gpt-x")
    helper = Attribution("key:acme", "u1", "helper", "claude")
    await ledger.record(web, tally(1, 100, client=1), now=hour + 10)
    await ledger.record(web, tally(2, 200, server=2), now=hour + 3599)
    await ledger.record(web, tally(4, 400, client=1), now=hour + 3600)  # the next hour
    await ledger.record(helper, tally(1), now=hour + 7200)
    await ledger.record(other, tally(8, 800), now=hour + 60)
    await ledger.record(anon, tally(3, 300), now=hour - 1)  # the hour before
    await ledger.record(anon, Tally(), now=hour)  # nothing: not listed for it

    totals = await ledger.totals(start=hour + 1800, end=hour + 3600 * 3)  # from 9:00 to 12:00
    assert [who for who, _ in totals] == [web, helper, other]  # by key, user, agent, model
    assert totals[0][1] == Tally(
        steps=7,
        input_tokens=70,
        output_tokens=7,
        cost=700,
        tool_calls={"client": 2, "server": 2},
    )
    assert totals[1][1] == tally(1)
    assert totals[2][1] == tally(8, 800)
    # end is exclusive (the 10:00 hour starts at end); key filters.
    only_acme = await ledger.totals(start=hour - 3600, end=hour + 3600, key="key:acme")
    assert only_acme == [(anon, tally(3, 300)), (web, tally(3, 300, client=1, server=2))]
    assert await ledger.totals(start=hour, end=hour + 3600, key="key:none") == []
    assert await ledger.totals(start=hour + 7200, end=hour) == []


async def test_totals_read_at_most_93_days(ledger: Ledger) -> None:
    await ledger.totals(start=NOON - 93 * 86_400, end=NOON)
    with pytest.raises(ValueError, match="at most 93 days"):
        await ledger.totals(start=NOON - 93 * 86_400 - 1, end=NOON)


async def test_record_refuses_the_field_separator_in_a_name(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="separator"):
        await ledger.record(Attribution("key:a", "u\x1f1", "bot", "m"), tally(1), now=NOON)
    with pytest.raises(ValueError, match="separator"):
        await ledger.record(
            Attribution("key:a", "", "bot", "m"), Tally(tool_calls={"a\x1f": 1}), now=NOON
        )
    assert await ledger.totals(start=NOON - 3600, end=NOON + 3600) == []


async def test_names_with_odd_characters_round_trip_through_totals(ledger: Ledger) -> None:
    who = Attribution("key:a:b", "user 1/ü@x", "bót:2", "models/gemini-2.5 {x}")
    await ledger.record(who, tally(2, 5, **{"mcp:search": 1}), now=NOON)
    assert await ledger.totals(start=NOON, end=NOON + 1) == [
        (who, tally(2, 5, **{"mcp:search": 1}))
    ]


async def test_hours_older_than_keep_days_are_dropped() -> None:
    ledger = MemoryLedger(keep_days=1)
    who = Attribution("key:a", "", "bot", "m")
    await ledger.record(who, tally(1), now=NOON - 2 * 86_400)
    await ledger.record(who, tally(2), now=NOON)
    assert await ledger.totals(start=NOON - 3 * 86_400, end=NOON + 1) == [(who, tally(2))]


async def test_redis_hours_expire_after_keep_days(redis: RedisServer) -> None:
    from gateway.store.redis import RedisStore

    redis.flushall()
    store = RedisStore.from_url(redis.url, session_ttl=60, lease_ttl=10, prefix="t:")
    try:
        ledger = ledger_for(store, keep_days=0.5)
        await ledger.record(Attribution("key:a", "", "bot", "m"), tally(1), now=NOON)
        ttl = await store.client.ttl(f"t:u:h:{int(NOON // 3600 * 3600)}")
        assert ttl == pytest.approx(43_200, abs=5)
        reserved(await ledger.reserve([check(requests_per_minute=5)], tokens=1, cost=0, now=NOON))
        assert 0 < await store.client.pttl(f"t:u:w:{KEY}") <= 120_000
    finally:
        await store.aclose()


# Two nodes racing, and an unreachable Redis.


async def test_fifty_racing_reservations_overshoot_a_day_cap_by_at_most_one_estimate(
    redis: RedisServer,
) -> None:
    from gateway.store.redis import RedisStore

    redis.flushall()
    nodes = [RedisStore.from_url(redis.url, session_ttl=60, lease_ttl=10) for _ in range(2)]
    try:
        ledgers = [ledger_for(node) for node in nodes]
        cap, estimate = 1.0, 70_000  # 1.0 a day; each step reserves 0.07
        daily = [check(cost_per_day=cap)]
        outcomes = await asyncio.gather(
            *(
                ledgers[n % 2].reserve(daily, tokens=10, cost=estimate, now=NOON + n / 100)
                for n in range(50)
            )
        )
        passed = sum(isinstance(outcome, Reservation) for outcome in outcomes)
        spent = (await ledgers[0].spent(KEY, now=NOON))[0]
        print(
            f"cap={cap * MICRO:.0f} estimate={estimate} passed={passed} "
            f"refused={50 - passed} reserved={spent}"
        )
        assert spent == passed * estimate
        assert cap * MICRO <= spent <= cap * MICRO + estimate
        assert passed == 15  # 14 leave 20_000 left: a 15th goes through, not a 16th
    finally:
        for node in nodes:
            await node.aclose()


async def test_an_unreachable_redis_is_store_unavailable_without_the_password() -> None:
    from gateway.store.redis import RedisStore

    store = RedisStore.from_url("redis://:s3cret@127.0.0.1:1/0", session_ttl=60, lease_ttl=10)
    try:
        ledger = ledger_for(store)
        with pytest.raises(StoreUnavailable) as caught:
            await ledger.reserve([check(cost_per_day=1.0)], tokens=1, cost=1, now=NOON)
        assert "usage ledger" in str(caught.value)
        assert "127.0.0.1:1" in str(caught.value)
        assert "s3cret" not in str(caught.value)
        with pytest.raises(StoreUnavailable):
            await ledger.totals(start=NOON, end=NOON + 1)
    finally:
        await store.aclose()


def test_ledger_for_memory_and_importing_the_store_does_not_load_redis() -> None:
    assert isinstance(ledger_for(MemoryStore()), MemoryLedger)
    code = (
        "import sys, gateway.store as s; s.ledger_for(s.MemoryStore()); "
        "assert 'redis' not in sys.modules, 'redis loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

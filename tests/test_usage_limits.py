"""Metering's pure parts: prices, the limits file, and the core summing a response's cost
and reporting a refused step (docs/usage.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth.admission import SessionQuota
from gateway.auth.credentials import TokenIssuer, TokenRequest, TokenRequestError
from gateway.auth.limits import Budgets
from gateway.core.event import ModelFailed
from gateway.core.model import ModelFinish, ModelText, ModelToolCall, ModelUsage
from gateway.core.principal import Principal
from gateway.core.usage import Limits, Price, Tally, estimate_tokens
from gateway.errors import ConfigError, TooManySessions
from gateway.wire.v1 import (
    Error,
    LimitHit,
    ResponseDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    UserMessage,
)
from tests.test_session import Harness

LIMITS_TOML = """
[prices.scripted]
input = 1.0
output = 2.0

[keys.backend]
tokens_per_minute = 1000
concurrent_sessions = 3

[keys.backend.end_users]
cost_per_day = 0.5
concurrent_sessions = 1

[keys."*"]
requests_per_minute = 5

[agents.support]
cost_per_month = 10.0
concurrent_sessions = 2
"""


@pytest.fixture
def budgets(tmp_path: Path) -> Budgets:
    path = tmp_path / "limits.toml"
    path.write_text(LIMITS_TOML)
    return Budgets.load(path)


def user(key: str, user_id: str, **claims: object) -> Principal:
    return Principal(
        name=f"key:{key}/user:{user_id}",
        kind="client_token",
        key_name=key,
        user_id=user_id,
        claims=dict(claims),
    )


def test_price_counts_cached_and_audio_apart_and_never_audio_at_the_text_rate():
    price = Price(input=1.0, output=2.0, cached_input=0.5)
    # 1000 input of which 400 cached, 100 output: 600*1 + 400*0.5 + 100*2 micro-units
    assert price.cost(input_tokens=1000, output_tokens=100, cached_input_tokens=400) == 1000
    assert price.cost(input_tokens=10, output_tokens=0, input_audio_tokens=5) is None
    priced = Price(input=1.0, output=2.0, input_audio=10.0, output_audio=20.0)
    cost = priced.cost(
        input_tokens=10, output_tokens=4, input_audio_tokens=5, output_audio_tokens=3
    )
    assert cost == 5 * 1 + 5 * 10 + 1 * 2 + 3 * 20
    assert Price(input=0.15, output=0.6).cost(input_tokens=1, output_tokens=0) == 1  # rounds up
    assert estimate_tokens(9) == 3


def test_tally_counters_round_trip_and_add():
    tally = Tally(steps=2, input_tokens=5, cost=7, tool_calls={"client": 1})
    assert tally.counters() == {"steps": 2, "input_tokens": 5, "cost": 7, "tool_calls.client": 1}
    again = Tally.from_counters({**tally.counters(), "from_a_newer_node": 3})
    again.add(tally)
    assert (again.steps, again.cost, again.tool_calls) == (4, 14, {"client": 2})


def test_checks_take_the_key_its_end_users_and_the_agent(budgets: Budgets):
    checks = budgets.checks(user("backend", "42"), "support")
    assert [(c.scope, c.subject) for c in checks] == [
        ("key", "key:backend"),
        ("end_user", "key:backend/user:42"),
        ("agent", "agent:support"),
    ]
    assert checks[0].limits == Limits(tokens_per_minute=1000, concurrent_sessions=3)
    assert checks[1].limits.cost_per_day == 0.5


def test_an_unnamed_key_gets_the_star_entry_and_no_limits_mean_no_checks(budgets: Budgets):
    other = Principal(name="key:other", kind="api_key", key_name="other")
    (check,) = budgets.checks(other, "sales")
    assert (check.subject, check.limits.requests_per_minute) == ("key:other", 5)
    assert Budgets().checks(other, "sales") == ()


def test_a_tokens_own_limits_replace_the_end_user_default(budgets: Budgets):
    checks = budgets.checks(user("backend", "7", limits={"cost_per_day": 2.0}), "x")
    assert checks[1].limits == Limits(cost_per_day=2.0)


def test_minting_checks_a_users_limits():
    issuer = TokenIssuer(b"s" * 32, ttl=60, max_ttl=60)
    good = TokenRequest(user={"id": "u1", "limits": {"tokens_per_minute": 100}})
    token = issuer.mint("backend", good, agent="a", now=0).token
    principal = issuer.verify(token, now=1, agent="a", origin=None)
    assert principal.claims["limits"] == {"tokens_per_minute": 100}
    with pytest.raises(TokenRequestError, match=r"user\.limits"):
        issuer.mint(
            "backend", TokenRequest(user={"id": "u1", "limits": {"tpm": 1}}), agent="a", now=0
        )


def test_concurrent_sessions_hold_the_key_the_end_user_and_the_agent(budgets: Budgets):
    quota = SessionQuota(max_total=None, max_per_principal=None, caps=budgets.session_caps)
    quota.reserve("key:backend/user:1", "support")
    with pytest.raises(TooManySessions, match="this user"):
        quota.reserve("key:backend/user:1", "support")  # its end user's cap: 1
    quota.reserve("key:backend/user:2", "support")
    with pytest.raises(TooManySessions, match="this agent"):
        quota.reserve("key:backend/user:3", "support")  # the agent's cap: 2
    quota.reserve("key:backend/user:3", "sales")
    with pytest.raises(TooManySessions, match="this app"):
        quota.reserve("key:backend/user:4", "sales")  # the key's cap: 3
    quota.release("key:backend/user:1", "support")
    quota.reserve("key:backend/user:4", "support")
    assert quota.total == 3


def test_a_cost_cap_needs_every_models_price(budgets: Budgets):
    budgets.check_priced(["scripted"])
    with pytest.raises(ConfigError, match="gpt-4o-mini"):
        budgets.check_priced(["scripted", "gpt-4o-mini"])
    Budgets().check_priced(["gpt-4o-mini"])  # no cost cap: an unknown cost is only reported


def test_a_bad_limits_file_names_the_field(tmp_path: Path):
    path = tmp_path / "limits.toml"
    path.write_text("[keys.backend]\ntokens_per_hour = 5\n")
    with pytest.raises(ConfigError, match="tokens_per_hour"):
        Budgets.load(path)


def test_a_response_sums_its_steps_cost_and_an_unknown_one_makes_it_unknown():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="lamp on"))
    (batch,) = h.model(
        ModelToolCall(name="lamp", args={"on": True}),
        ModelFinish(usage=ModelUsage(input_tokens=3, output_tokens=2, cost=0.25)),
    )
    assert isinstance(batch, ToolCalls)
    (call,) = batch.calls
    h.feed(ToolResults(results=[ToolResult(call_id=call.call_id, tool="lamp", output=1)]))
    sent = h.model(ModelText("on"), ModelFinish(usage=ModelUsage(output_tokens=1, cost=0.5)))
    done = sent[-1]
    assert isinstance(done, ResponseDone)
    assert done.usage is not None
    assert (done.usage.cost, done.usage.input_tokens, done.usage.output_tokens) == (0.75, 3, 3)
    h.feed(UserMessage(text="again"))
    sent = h.model(ModelText("ok"), ModelFinish(usage=ModelUsage(input_tokens=1)))  # no price
    done = sent[-1]
    assert isinstance(done, ResponseDone)
    assert done.usage is not None
    assert done.usage.cost is None


def test_a_refused_step_fails_its_response_with_the_limit_and_keeps_the_message():
    h = Harness()
    h.start()
    h.feed(UserMessage(text="hello there"))
    step = h.last_model_call().step_id
    hit = LimitHit(scope="end_user", name="tokens_per_minute", value=100)
    sent = h.feed(ModelFailed(step, "over", code="rate_limited", retry_after=12.5, limit=hit))
    error = next(m for m in sent if isinstance(m, Error))
    assert (error.code, error.retry_after, error.limit, error.retryable) == (
        "rate_limited",
        12.5,
        hit,
        True,
    )
    done = next(m for m in sent if isinstance(m, ResponseDone))
    assert done.status == "failed"
    h.feed(UserMessage(text="and now?"))
    items = h.last_model_call().request.items
    assert "hello there" in repr(items)
    assert "and now?" in repr(items)

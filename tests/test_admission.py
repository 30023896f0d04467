"""The pure admission counts: sockets per address, sessions in total and per principal."""

from __future__ import annotations

import pytest

from gateway.auth.admission import AddressCounter, SessionQuota, proxy_networks
from gateway.errors import CloseCode, TooManySessions


def test_an_address_gets_its_sockets_back_when_they_close():
    sockets = AddressCounter(2)
    assert sockets.acquire("10.0.0.1")
    assert sockets.acquire("10.0.0.1")
    assert not sockets.acquire("10.0.0.1")
    assert sockets.acquire("10.0.0.2")  # each address has its own count
    sockets.release("10.0.0.1")
    assert sockets.open("10.0.0.1") == 1
    assert sockets.acquire("10.0.0.1")


def test_trusted_proxies_are_not_limited_but_everyone_else_is():
    networks = proxy_networks("127.0.0.1, ::1, 10.1.0.0/16, *, /run/proxy.sock")
    assert [str(n) for n in networks] == ["127.0.0.1/32", "::1/128", "10.1.0.0/16"]
    sockets = AddressCounter(1, exempt=networks)
    assert all(sockets.acquire("127.0.0.1") for _ in range(100))  # a local client
    assert all(sockets.acquire("10.1.2.3") for _ in range(100))
    assert sockets.acquire("203.0.113.7")
    assert not sockets.acquire("203.0.113.7")
    assert sockets.acquire("not-an-address")  # counted like any other name
    assert not sockets.acquire("not-an-address")


def test_no_limit_counts_but_never_refuses():
    sockets = AddressCounter(None)
    assert all(sockets.acquire("10.0.0.1") for _ in range(1000))
    assert sockets.open("10.0.0.1") == 1000


def test_a_principal_over_its_quota_gets_4029_and_others_go_on():
    quota = SessionQuota(max_total=None, max_per_principal=1)
    quota.reserve("key:a")
    with pytest.raises(TooManySessions) as refused:
        quota.reserve("key:a")
    assert refused.value.close_code == CloseCode.TOO_MANY_SESSIONS
    assert refused.value.label == "too_many_sessions"
    quota.reserve("key:b")
    assert (quota.held("key:a"), quota.total) == (1, 2)  # the refusal counted nothing
    quota.release("key:a")
    quota.reserve("key:a")


def test_a_full_gateway_refuses_everyone_with_1013():
    quota = SessionQuota(max_total=2, max_per_principal=5)
    quota.reserve("key:a")
    quota.reserve("key:b")
    with pytest.raises(TooManySessions) as refused:
        quota.reserve("key:c")
    assert (refused.value.close_code, refused.value.label) == (CloseCode.TRY_AGAIN, "gateway_full")
    quota.release("key:b")
    quota.reserve("key:c")
    assert quota.total == 2

"""The one close table (``gateway.errors``): every error carries its label, its row gives its
wire code, close code and reason, and docs/protocol.md lists the same close codes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gateway.errors
from gateway.auth.credentials import AuthError, TokenRequestError
from gateway.errors import (
    CloseCode,
    GatewayError,
    StoreUnavailable,
    TooManySessions,
    closing,
    of_error,
)

ROOT = Path(__file__).parents[1]

ERRORS = [
    *(
        cls
        for cls in vars(gateway.errors).values()
        if isinstance(cls, type) and issubclass(cls, GatewayError)
    ),
    AuthError,
    TokenRequestError,
]
AUTH_LABELS = ["no_token", "no_key", "bad_token", "bad_key", "token_expired", "wrong_agent"]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_no_error_class_holds_a_close_code_of_its_own(cls: type[GatewayError]):
    holds = {name for name in ("close_code", "code") if name in vars(cls)}
    assert holds <= ({"close_code"} if cls is GatewayError else set())


@pytest.mark.parametrize(
    "cls", [c for c in ERRORS if c not in (AuthError, TooManySessions)], ids=lambda c: c.__name__
)
def test_every_error_class_label_is_a_row_with_a_wire_code(cls: type[GatewayError]):
    row = closing(cls.label)
    assert row.error_code is not None
    error = cls("message")
    assert (error.code, error.close_code) == (row.error_code, row.code)


@pytest.mark.parametrize("label", [*AUTH_LABELS, "wrong_origin"])
def test_a_refused_credential_closes_with_4001_and_its_own_reason(label: str):
    error = AuthError("token expired", label=label)
    assert error.code == "unauthorized"
    assert of_error(error) == (CloseCode.UNAUTHORIZED, "token expired", label, "unauthorized")


def test_a_store_that_does_not_answer_is_refused_without_its_address():
    error = StoreUnavailable("redis at 10.0.0.7:6379 does not answer")
    close = of_error(error)
    assert (close.code, close.label, close.error_code) == (
        CloseCode.TRY_AGAIN,
        "store_unavailable",
        "store_unavailable",
    )
    assert "10.0.0.7" not in close.reason
    assert close.reason == closing("store_unavailable").reason


@pytest.mark.parametrize(
    ("label", "code"),
    [
        ("too_many_sessions", CloseCode.TOO_MANY_SESSIONS),
        ("gateway_full", CloseCode.TRY_AGAIN),
        ("shutting_down", CloseCode.SERVICE_RESTART),
    ],
)
def test_a_session_quota_closes_by_its_label(label: str, code: CloseCode):
    usual = TooManySessions(label=label)
    assert of_error(usual) == closing(label)
    assert usual.close_code == code
    assert str(usual) == closing(label).reason
    told = TooManySessions("at most 2 per client", label=label)
    assert of_error(told).reason == "at most 2 per client"


def test_an_unknown_label_is_refused_at_once():
    with pytest.raises(KeyError):
        closing("no_such_label")
    with pytest.raises(KeyError):
        TooManySessions(label="no_such_label")


def test_every_close_code_of_the_table_is_documented_in_protocol_md():
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text[text.index("### Close codes") : text.index("## Limits")]
    documented = {int(code) for code in re.findall(r"^\| (\d{4}) \|", section, re.MULTILINE)}
    rows = gateway.errors._CLOSES
    used = {closing(label).code for label in rows}
    # 1011 is also a failure's that ends no socket; 1001 is never sent.
    assert used <= documented | {CloseCode.INTERNAL}
    assert documented <= {*used, CloseCode.INVALID_DATA, CloseCode.TOO_BIG}

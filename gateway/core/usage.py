"""What metering counts and what a limit says: plain values, no I/O.

Shared by the limits file (``gateway.auth.limits``: which limits hold whom), the usage
ledger (``gateway.store.ledger``: reserve, settle, record, totals, in memory or on Redis)
and a session's meter (``gateway.shell.meter``: a reservation before every model step).

Money is counted in micro-units of the price table's currency (``1_000_000`` is one dollar
when prices are in dollars): integers add up exactly, on Redis too (``HINCRBY``).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

__all__ = [
    "MICRO",
    "Attribution",
    "Check",
    "Limits",
    "Price",
    "Refusal",
    "Reservation",
    "Scope",
    "Tally",
    "estimate_tokens",
]

MICRO = 1_000_000
"""Micro-units in one unit of the price table's currency."""

Scope = Literal["key", "end_user", "agent"]
"""Who a limit holds: an API key (all its end users together), one end user of a key, or
an agent (whatever key talks to it)."""

_Count = Annotated[int, msgspec.Meta(ge=0)]
_Money = Annotated[float, msgspec.Meta(ge=0)]


class Limits(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """The limits of one key, end user or agent; ``None``: not limited."""

    tokens_per_minute: _Count | None = None
    """Model tokens (input and output) over the last 60 s, a sliding window."""
    requests_per_minute: _Count | None = None
    """Model steps started over the last 60 s, a sliding window."""
    cost_per_day: _Money | None = None
    """Cost of the UTC calendar day, in the price table's currency."""
    cost_per_month: _Money | None = None
    """Cost of the UTC calendar month."""
    concurrent_sessions: _Count | None = None
    """Sessions held at once (live or waiting for a resume), counted by each node."""

    @property
    def metered(self) -> bool:
        """Whether a model step has anything to reserve against (all but sessions)."""
        return (
            self.tokens_per_minute is not None
            or self.requests_per_minute is not None
            or self.cost_per_day is not None
            or self.cost_per_month is not None
        )

    @property
    def costed(self) -> bool:
        return self.cost_per_day is not None or self.cost_per_month is not None


class Check(msgspec.Struct, frozen=True):
    """One subject's limits a model step is held to."""

    scope: Scope
    subject: str
    """``key:NAME``, ``key:NAME/user:ID`` or ``agent:NAME``: what its counters are kept by."""
    limits: Limits


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A step not started: the first limit it would go over."""

    code: Literal["rate_limited", "budget_exceeded"]
    scope: Scope
    subject: str
    limit: str
    """The field of ``Limits`` that was hit: ``tokens_per_minute``, ``cost_per_day``..."""
    value: float
    """That limit's value."""
    retry_after: float
    """Seconds until the step would be let through (a window slides, a day or month ends)."""


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A step let through: what was reserved for it, settled with the real usage after."""

    at: float
    """When (Unix seconds): its window bucket, its day and month."""
    checks: tuple[Check, ...]
    tokens: int
    cost: int
    """Micro-units."""


class Attribution(msgspec.Struct, frozen=True):
    """Whose usage: the key (or the key that minted the client token), the end user
    (``""``: none), the agent and the model."""

    key: str
    end_user: str
    agent: str
    model: str


class Tally(msgspec.Struct, kw_only=True):
    """Usage counted: every field adds up (the ledger keeps one per attribution and hour)."""

    steps: int = 0
    input_tokens: int = 0
    """All input tokens, cached and audio ones included."""
    output_tokens: int = 0
    cached_input_tokens: int = 0
    input_audio_tokens: int = 0
    output_audio_tokens: int = 0
    cost: int = 0
    """Micro-units, of the priced steps only."""
    unpriced_steps: int = 0
    """Steps whose cost is unknown (their model has no price): the cost is then a floor."""
    tool_calls: dict[str, int] = msgspec.field(default_factory=dict)
    """By kind: ``client``, ``server``, ``async``..."""
    audio_in_ms: int = 0
    audio_out_ms: int = 0

    def add(self, other: Tally) -> None:
        for name in _COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for kind, count in other.tool_calls.items():
            self.tool_calls[kind] = self.tool_calls.get(kind, 0) + count

    def counters(self) -> dict[str, int]:
        """The non-zero counters, flat: ``tool_calls.KIND`` for the calls."""
        flat = {name: getattr(self, name) for name in _COUNTERS if getattr(self, name)}
        flat.update({f"tool_calls.{kind}": n for kind, n in self.tool_calls.items() if n})
        return flat

    @classmethod
    def from_counters(cls, flat: dict[str, int]) -> Tally:
        """The inverse of ``counters`` (unknown names are dropped: a newer node's)."""
        tally = cls()
        for name, value in flat.items():
            if name.startswith("tool_calls."):
                tally.tool_calls[name.removeprefix("tool_calls.")] = value
            elif name in _COUNTERS:
                setattr(tally, name, value)
        return tally


_COUNTERS = tuple(name for name in Tally.__struct_fields__ if name != "tool_calls")


class Price(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a model costs, per million tokens. Audio has prices of its own: audio tokens
    are never billed at the text rate (a step with audio tokens and no audio price has an
    unknown cost)."""

    input: _Money
    output: _Money
    cached_input: _Money | None = None
    """Cached input tokens; the input price when not given."""
    input_audio: _Money | None = None
    output_audio: _Money | None = None

    def cost(
        self,
        *,
        input_tokens: int,
        output_tokens: int,
        cached_input_tokens: int = 0,
        input_audio_tokens: int = 0,
        output_audio_tokens: int = 0,
    ) -> int | None:
        """Micro-units (a price per million tokens is micro-units per token); ``None``
        when audio tokens have no price."""
        if (input_audio_tokens and self.input_audio is None) or (
            output_audio_tokens and self.output_audio is None
        ):
            return None
        cached = min(cached_input_tokens, input_tokens)
        plain_input = max(input_tokens - cached - input_audio_tokens, 0)
        cached_price = self.cached_input if self.cached_input is not None else self.input
        total = (
            plain_input * self.input
            + cached * cached_price
            + max(output_tokens - output_audio_tokens, 0) * self.output
            + input_audio_tokens * (self.input_audio or 0.0)
            + output_audio_tokens * (self.output_audio or 0.0)
        )
        return math.ceil(total)


def estimate_tokens(characters: int) -> int:
    """Tokens in a text of ``characters``, estimated before a step (about four characters a
    token in English; rounded up, so an estimate errs on the side of the budget)."""
    return -(-characters // 4)

"""The limits file (``gateway serve --limits FILE``): usage limits and model prices.

Which limits hold a model step (``Budgets.checks``): its API key's (``[keys.NAME]``, all its
end users together), its end user's (the token's own ``limits`` claim, or the default for
every end user of the key, ``[keys.NAME.end_users]``) and its agent's (``[agents.NAME]``,
whatever key talks to it). ``[keys."*"]`` holds the keys not named. ``[prices.MODEL]`` turns
usage into cost. docs/usage.md describes the file; the counting is the ledger's
(``gateway.store.ledger``), the reservation before each step the session's meter's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import msgspec

from gateway.config import load_toml
from gateway.core.principal import Principal
from gateway.core.usage import Check, Limits, Price
from gateway.errors import ConfigError

__all__ = ["ANY_KEY", "Budgets", "KeyLimits", "LimitsFile", "attribution_key", "user_limits"]

ANY_KEY = "*"
"""The ``[keys]`` entry for every key not named."""

ANONYMOUS_KEY = "anonymous"
"""The key usage without credentials (``--no-auth``) counts under."""


class KeyLimits(Limits, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[keys.NAME]``: the key's own limits, and ``end_users``, those of each of its end
    users."""

    end_users: Limits | None = None


class Estimate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[estimate]``: what a step is reckoned to cost before it runs."""

    output_tokens: Annotated[int, msgspec.Meta(ge=0)] = 1024
    """A step's output when its model sets no ``max_tokens``."""


class UsageSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[usage]``: reading and keeping usage."""

    readers: tuple[str, ...] = ()
    """Keys that may read every key's usage on ``GET /v1/usage`` (others read their own)."""
    keep_days: Annotated[float, msgspec.Meta(gt=0)] = 400.0
    """Days the hourly totals are kept."""


class LimitsFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    keys: dict[str, KeyLimits] = msgspec.field(default_factory=dict)
    agents: dict[str, Limits] = msgspec.field(default_factory=dict)
    prices: dict[str, Price] = msgspec.field(default_factory=dict)
    estimate: Estimate = Estimate()
    usage: UsageSettings = UsageSettings()


def attribution_key(principal: Principal) -> str:
    """The key a principal's usage counts under: its API key, or the one that minted its
    token; ``anonymous`` without credentials."""
    return principal.key_name or ANONYMOUS_KEY


def user_limits(raw: Any) -> Limits:
    """The ``limits`` of a token's end user, as its backend stated them.

    Raises:
        ValueError: not a table of ``Limits`` fields.
    """
    try:
        return msgspec.convert(raw, Limits)
    except msgspec.ValidationError as exc:
        raise ValueError(f"user.limits: {exc}") from exc


class Budgets:
    """The limits file, as the gateway asks it things."""

    def __init__(self, spec: LimitsFile | None = None) -> None:
        self.spec = spec or LimitsFile()

    @classmethod
    def load(cls, path: str | Path | None) -> Budgets:
        """The file at ``path``; no limits and no prices without one.

        Raises:
            ConfigError: unreadable, not TOML, or a wrong field (named).
        """
        if path is None:
            return cls()
        return cls(load_toml(Path(path), LimitsFile))

    def price(self, model: str) -> Price | None:
        return self.spec.prices.get(model)

    def may_read_all(self, key: str) -> bool:
        return key in self.spec.usage.readers

    def _key(self, key: str) -> KeyLimits | None:
        keys = self.spec.keys
        return keys.get(key) or keys.get(ANY_KEY)

    def checks(self, principal: Principal, agent: str) -> tuple[Check, ...]:
        """The limits a model step of ``principal`` talking to ``agent`` is held to (those
        with something to reserve)."""
        key = attribution_key(principal)
        checks = []
        key_limits = self._key(key)
        if key_limits is not None:
            checks.append(Check("key", f"key:{key}", _plain(key_limits)))
        end_user = self._end_user(principal, key_limits)
        if end_user is not None:
            checks.append(Check("end_user", f"key:{key}/user:{principal.user_id}", end_user))
        agent_limits = self.spec.agents.get(agent)
        if agent_limits is not None:
            checks.append(Check("agent", f"agent:{agent}", agent_limits))
        return tuple(check for check in checks if check.limits.metered)

    @staticmethod
    def _end_user(principal: Principal, key_limits: KeyLimits | None) -> Limits | None:
        if principal.user_id is None:
            return None
        own = principal.claims.get("limits")
        if own is not None:
            try:
                return user_limits(own)
            except ValueError:
                pass  # signed by this gateway, so checked at minting; an older format
        return key_limits.end_users if key_limits is not None else None

    def session_caps(self, principal: str, agent: str) -> list[tuple[str, int]]:
        """``(subject, at most)`` of the concurrent sessions a new session of ``principal``
        (``Principal.name``: ``key:NAME`` or ``key:NAME/user:ID``) with ``agent`` counts
        against. Only the file's defaults apply here: a token's own ``limits`` hold its
        steps, not its sessions."""
        caps = []
        key, user = _split(principal)
        key_limits = self._key(key) if key else None
        if key_limits is not None:
            if key_limits.concurrent_sessions is not None:
                caps.append((f"key:{key}", key_limits.concurrent_sessions))
            users = key_limits.end_users
            if user and users is not None and users.concurrent_sessions is not None:
                caps.append((principal, users.concurrent_sessions))
        agent_limits = self.spec.agents.get(agent)
        if agent_limits is not None and agent_limits.concurrent_sessions is not None:
            caps.append((f"agent:{agent}", agent_limits.concurrent_sessions))
        return caps

    def check_priced(self, models: Iterable[str]) -> None:
        """A cost limit needs every model's price: refuse to start without one.

        Raises:
            ConfigError: naming the models without a price.
        """
        spec = self.spec
        every = [
            *spec.keys.values(),
            *spec.agents.values(),
            *(key.end_users for key in spec.keys.values() if key.end_users is not None),
        ]
        costed = any(limits.costed for limits in every)
        unpriced = sorted({model for model in models if model not in spec.prices})
        if costed and unpriced:
            raise ConfigError(
                f"the limits file caps cost, but these models have no [prices] entry: "
                f"{', '.join(unpriced)} (their cost would be unknown)"
            )


def _plain(limits: KeyLimits) -> Limits:
    """A key's own limits, without its end users' (a ``Check`` holds plain ``Limits``)."""
    fields = {name: getattr(limits, name) for name in Limits.__struct_fields__}
    return Limits(**fields)


def _split(principal: str) -> tuple[str | None, str | None]:
    """``key:NAME/user:ID`` → (NAME, ID); ``key:NAME`` → (NAME, None); ``anonymous``:
    ``(anonymous, None)``."""
    if principal == ANONYMOUS_KEY:
        return ANONYMOUS_KEY, None
    if not principal.startswith("key:"):
        return None, None
    key, sep, user = principal[4:].partition("/user:")
    return key, (user if sep else None)

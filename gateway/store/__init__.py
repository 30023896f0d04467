"""Where sessions keep what must survive their socket and their process.

``base`` is the ``Store`` interface (with ``Lease`` and ``SessionRecord``), ``memory`` the
in-process store, ``redis`` the one every gateway node shares. ``store_from_config``
builds the one a ``Config`` names; only a gateway on Redis loads the Redis client.
"""

from __future__ import annotations

from gateway.config import Config
from gateway.errors import ConfigError
from gateway.store.base import Lease, LeaseLost, SessionRecord, Store
from gateway.store.ledger import Ledger, MemoryLedger
from gateway.store.memory import MemoryStore

__all__ = [
    "STORE_SCHEMES",
    "Lease",
    "LeaseLost",
    "Ledger",
    "MemoryLedger",
    "MemoryStore",
    "SessionRecord",
    "Store",
    "ledger_for",
    "store_from_config",
]

STORE_SCHEMES = ("redis", "rediss", "unix")
"""URL schemes ``Config.store`` accepts besides ``memory``."""


def store_from_config(config: Config) -> Store:
    """The store ``config.store`` names: ``memory``, or Redis at a URL.

    Raises:
        ConfigError: ``config.store`` is neither ``memory`` nor a Redis URL.
    """
    if config.store == "memory":
        return MemoryStore(max_events=config.replay_max_events, max_size=config.replay_max_size)
    scheme, sep, _ = config.store.partition("://")
    if not sep or scheme not in STORE_SCHEMES:
        raise ConfigError(
            "store: expected 'memory' or a redis://, rediss:// or unix:// URL, got "
            + (f"a {scheme}:// URL" if sep else repr(config.store))
        )
    from gateway.store.redis import RedisStore  # only a gateway on Redis loads the client

    try:
        return RedisStore.from_url(
            config.store,
            session_ttl=config.session_ttl,
            lease_ttl=config.lease_ttl,
            max_events=config.replay_max_events,
            max_size=config.replay_max_size,
        )
    except ValueError as exc:
        raise ConfigError(f"store: not a valid {scheme}:// URL: {exc}") from exc


def ledger_for(store: Store, *, keep_days: float = 400) -> Ledger:
    """The usage ledger that goes with ``store``: on a ``RedisStore``, one on the same Redis
    (its client and key prefix: every node counts in one place); else one in memory."""
    if isinstance(store, MemoryStore):
        return MemoryLedger(keep_days=keep_days)
    from gateway.store.redis import RedisStore  # only a gateway on Redis loads the client

    if not isinstance(store, RedisStore):
        return MemoryLedger(keep_days=keep_days)
    from gateway.store.ledger_redis import RedisLedger

    return RedisLedger(store.client, prefix=store.prefix, keep_days=keep_days, where=store.where)

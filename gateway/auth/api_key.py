"""API keys: what backends authenticate with. Only their SHA-256 digests are kept.

Keys come as ``name:key`` entries from a file and/or ``GATEWAY_API_KEYS``. A key is
compared with every known digest in constant time; errors name an entry by its
number and a key by its name, never by its value.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from pathlib import Path

from gateway.config import Config
from gateway.errors import ConfigError

__all__ = ["MIN_KEY_SIZE", "ApiKeys", "parse_api_keys"]

MIN_KEY_SIZE = 16
_KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_api_keys(entries: Iterable[str], source: str) -> dict[str, bytes]:
    """``name:key`` entries (blank ones and ``#`` comments skipped) as name -> digest.

    Raises:
        ConfigError: an entry is malformed, a name repeats or a key is too short; the
            message names the source and the entry's number, never the key.
    """
    digests: dict[str, bytes] = {}
    for number, raw in enumerate(entries, start=1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        name, sep, key = (part.strip() for part in entry.partition(":"))
        where = f"{source}: entry {number}"
        if not sep or not _KEY_NAME.match(name):
            raise ConfigError(f"{where}: expected name:key, the name in [A-Za-z0-9_.-]{{1,64}}")
        if len(key) < MIN_KEY_SIZE:
            raise ConfigError(f"{where}: key {name!r} is shorter than {MIN_KEY_SIZE} characters")
        if name in digests:
            raise ConfigError(f"{where}: key name {name!r} appears twice")
        digests[name] = _digest(key)
    return digests


class ApiKeys:
    """The API keys a gateway accepts, as digests."""

    def __init__(self, digests: dict[str, bytes]) -> None:
        self._digests = list(digests.items())

    @classmethod
    def from_config(cls, config: Config) -> ApiKeys:
        """From ``api_keys_file`` and ``api_keys`` (both may be set).

        Raises:
            ConfigError: the file is unreadable or an entry is invalid.
        """
        digests: dict[str, bytes] = {}
        if config.api_keys_file:
            path = Path(config.api_keys_file)
            try:
                lines = path.read_text().splitlines()
            except OSError as exc:
                raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
            digests |= parse_api_keys(lines, str(path))
        if config.api_keys:
            for name, digest in parse_api_keys(
                config.api_keys.split(","), "GATEWAY_API_KEYS"
            ).items():
                if name in digests:
                    raise ConfigError(f"key name {name!r} is both in the file and GATEWAY_API_KEYS")
                digests[name] = digest
        return cls(digests)

    def __len__(self) -> int:
        return len(self._digests)

    def name_of(self, key: str) -> str | None:
        """The name of ``key``, or ``None``. Compares with every key, in constant time."""
        digest = _digest(key)
        found = None
        for name, known in self._digests:
            if hmac.compare_digest(known, digest):
                found = name
        return found

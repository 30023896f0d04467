"""The HTTP settings of a model: a value of their own, read from an agent file's ``[model]``
table, which the request (``http``) and the reading of its answer (``answer``) both use.
"""

from __future__ import annotations

import msgspec

__all__ = ["HttpModel"]


class HttpModel(msgspec.Struct, frozen=True, kw_only=True):
    """The HTTP settings of a model, from the agent's ``[model]`` table."""

    model: str
    base_url: str
    api_key: str | None = None
    connect_timeout: float = 10.0
    first_byte_timeout: float | None = 15.0
    """Seconds from sending the request to the first byte of the answer (None: no limit)."""
    stall_timeout: float | None = 60.0
    """Seconds without a byte once the answer flows before it counts as stalled (None: no
    limit)."""
    max_retries: int = 2
    """Retries while nothing of the step has reached the client."""
    max_retry_after: float = 30.0
    """The longest ``Retry-After`` waited for; a server asking more fails the step at once."""
    max_connections: int = 1000
    """Connections to the model server at once: one per streaming step, so it bounds the
    steps in flight (httpx's own default, 100, would queue the 101st conversation)."""
    temperature: float | None = None
    max_tokens: int | None = None

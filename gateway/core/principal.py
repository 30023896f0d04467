"""Who a session belongs to: the principal an API key or a client token proves.

A plain value (msgspec, no I/O) so that the session core can hold it: the core
checks the client functions a token allows, and keeps the end user's claims for
tools. ``gateway.auth.credentials`` makes principals; nothing else does.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = ["ANONYMOUS", "Principal", "PrincipalKind"]

PrincipalKind = Literal["api_key", "client_token", "anonymous"]


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated caller.

    Attributes:
        name: short and stable, the owner of a session and the key quotas count by:
            ``key:backend`` (an API key, or a token without a user) or
            ``key:backend/user:42`` (a token minted for end user 42), ``anonymous``.
        kind: how the caller proved who it is.
        key_name: the API key that authenticated the caller or issued its token.
        user_id: the end user a token was minted for.
        scopes: the end user's scopes, as the issuing backend stated them.
        claims: the end user's other claims (free-form, bounded), for tools.
        client_functions: the client functions the holder may declare; ``None``
            allows any.
        agent: the agent a token is for.
        origin: the browser origin a token is bound to.
    """

    name: str
    kind: PrincipalKind
    key_name: str | None = None
    user_id: str | None = None
    scopes: tuple[str, ...] = ()
    claims: dict[str, Any] = msgspec.field(default_factory=dict)
    client_functions: frozenset[str] | None = None
    agent: str | None = None
    origin: str | None = None


ANONYMOUS = Principal(name="anonymous", kind="anonymous")
"""Every caller of a gateway running with ``--no-auth`` that presents no credential."""

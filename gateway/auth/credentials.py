"""Authentication: API keys for backends, short-lived signed client tokens for apps.

A backend holds an API key (``--api-keys-file``, ``GATEWAY_API_KEYS``) and, with
``POST /v1/sessions``, mints a client token for one browser or app: a JWT (HS256,
PyJWT) bound to an agent and a short expiry, and optionally to a browser origin
and the client functions its holder may declare, carrying the end user's claims.
Sockets present the token (or, server to server, the API key itself); what they
prove is a ``Principal``, kept with the session.

Only SHA-256 digests of API keys are kept, compared in constant time; keys and
tokens are never logged (a key's name is). Verification takes ``now``, so expiry
is testable without a clock. This module knows nothing of HTTP frameworks.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Annotated, Any

import jwt
import msgspec
import structlog

from gateway.auth.api_key import ApiKeys
from gateway.auth.limits import user_limits
from gateway.auth.origin import is_loopback_host, normalize_origin
from gateway.config import Config
from gateway.core.principal import ANONYMOUS, Principal
from gateway.errors import ConfigError, GatewayError
from gateway.wire.v1 import TOKEN_SUBPROTOCOL_PREFIX

__all__ = [
    "AuthError",
    "Authenticator",
    "MintedToken",
    "TokenIssuer",
    "TokenRequest",
    "TokenRequestError",
]

log = structlog.get_logger("gateway.auth")

MAX_TOKEN_SIZE = 6 * 1024
"""Longest token accepted (it travels in a header; websockets caps header lines at 8 KiB)."""
MAX_PAYLOAD_SIZE = 4 * 1024
"""Largest token payload minted, as JSON: bounds the user's free-form claims."""
MIN_SECRET_SIZE = 32
_AUDIENCE = "gateway.client"
_ALGORITHM = "HS256"
_FUNCTION_NAME = r"^[a-z][a-z0-9_]*$"


class AuthError(GatewayError):
    """A credential is missing or does not hold; ``reason`` says precisely why.

    Attributes:
        reason: for the caller (the close reason or the HTTP error), never a secret.
        label: a short snake_case name for logs and metrics (``no_token``, ...), and its
            row of the close table (``gateway.errors.closing``): 4001, code ``unauthorized``.
    """

    def __init__(self, reason: str, *, label: str) -> None:
        super().__init__(reason, label=label)
        self.reason = reason
        self.close_reason = reason


class TokenRequestError(GatewayError):
    """The body of a token request is not acceptable (HTTP 422 with the reason)."""

    label = "invalid_token_request"


# ----------------------------------------------------------------------------- tokens


class TokenRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/sessions``: what the token binds (all optional)."""

    agent: str | None = None
    expires_in: Annotated[float, msgspec.Meta(gt=0)] | None = None
    origin: str | None = None
    client_functions: (
        Annotated[
            list[Annotated[str, msgspec.Meta(pattern=_FUNCTION_NAME, max_length=64)]],
            msgspec.Meta(max_length=128),
        ]
        | None
    ) = None
    user: dict[str, Any] | None = None
    """``{"id": ..., "scopes": [...], "limits": {...}, ...}``: the end user; ``limits`` are
    their usage limits (docs/usage.md), other keys free-form claims."""


class _User(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    scopes: tuple[str, ...] = ()
    claims: dict[str, Any] = msgspec.field(default_factory=dict)


class _Claims(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A token's payload, as this gateway mints it."""

    sub: str
    key: str
    agent: str
    exp: float
    jti: str
    origin: str | None = None
    fns: list[str] | None = None
    user: _User | None = None


class MintedToken(msgspec.Struct, frozen=True, kw_only=True):
    token: str
    expires_at: float
    agent: str
    jti: str


class TokenIssuer:
    """Mints and verifies client tokens.

    Args:
        secret: the HMAC key, at least 32 bytes; the same on every node.
        ttl: default lifetime of a token, in seconds.
        max_ttl: the longest lifetime a request may ask for.
    """

    def __init__(self, secret: bytes, *, ttl: float, max_ttl: float) -> None:
        if len(secret) < MIN_SECRET_SIZE:
            raise ConfigError(f"the token secret must be at least {MIN_SECRET_SIZE} bytes")
        self._secret = secret
        self.ttl = ttl
        self.max_ttl = max(max_ttl, ttl)

    def mint(self, key_name: str, request: TokenRequest, *, agent: str, now: float) -> MintedToken:
        """A token for ``request``, issued with the key named ``key_name``.

        Raises:
            TokenRequestError: the request names another agent, asks for too long a
                lifetime, an invalid origin or user, or claims too large to carry.
        """
        if request.agent is not None and request.agent != agent:
            raise TokenRequestError(f"unknown agent {request.agent[:64]!r}")
        ttl = request.expires_in if request.expires_in is not None else self.ttl
        if ttl > self.max_ttl:
            raise TokenRequestError(f"expires_in: at most {self.max_ttl:g} seconds")
        origin = None
        if request.origin is not None:
            origin = normalize_origin(request.origin)
            if origin is None:
                raise TokenRequestError("origin: expected scheme://host[:port]")
        user = _user_from(request.user) if request.user is not None else None
        subject = f"key:{key_name}" + (f"/user:{user.id}" if user else "")
        jti = secrets.token_urlsafe(12)
        claims = _Claims(
            sub=subject,
            key=key_name,
            agent=agent,
            exp=round(now + ttl, 3),
            jti=jti,
            origin=origin,
            fns=sorted(set(request.client_functions))
            if request.client_functions is not None
            else None,
            user=user,
        )
        payload = msgspec.to_builtins(claims)
        payload |= {"aud": _AUDIENCE, "iat": int(now)}
        if len(msgspec.json.encode(payload)) > MAX_PAYLOAD_SIZE:
            raise TokenRequestError(f"the token's claims exceed {MAX_PAYLOAD_SIZE} bytes")
        token = jwt.encode(payload, self._secret, algorithm=_ALGORITHM)
        return MintedToken(token=token, expires_at=claims.exp, agent=agent, jti=jti)

    def verify(self, token: str, *, now: float, agent: str, origin: str | None) -> Principal:
        """The principal ``token`` proves, presented at ``now`` from ``origin``.

        Raises:
            AuthError: forged, malformed, expired, for another agent or bound to
                another origin, with the precise reason.
        """
        if len(token) > MAX_TOKEN_SIZE:
            raise AuthError("token too long", label="bad_token")
        try:
            payload = jwt.decode(
                token,
                self._secret,
                algorithms=[_ALGORITHM],
                audience=_AUDIENCE,
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
            )
            claims = msgspec.convert(payload, _Claims, strict=False)
        except jwt.InvalidSignatureError as exc:
            raise AuthError("bad signature", label="bad_token") from exc
        except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
            raise AuthError("not a client token of this gateway", label="bad_token") from exc
        except (jwt.PyJWTError, msgspec.ValidationError) as exc:
            raise AuthError("malformed token", label="bad_token") from exc
        if claims.exp <= now:
            raise AuthError("token expired", label="token_expired")
        if claims.agent != agent:
            raise AuthError(f"token is for agent {claims.agent[:64]!r}", label="wrong_agent")
        # Only a browser's Origin is checked: a browser always sends one on a WebSocket
        # or a request carrying a token, and a non-browser client could send any Origin.
        if (
            claims.origin is not None
            and origin is not None
            and normalize_origin(origin) != claims.origin
        ):
            raise AuthError(f"token is bound to origin {claims.origin!r}", label="wrong_origin")
        user = claims.user
        return Principal(
            name=claims.sub,
            kind="client_token",
            key_name=claims.key,
            user_id=user.id if user else None,
            scopes=user.scopes if user else (),
            claims=user.claims if user else {},
            client_functions=frozenset(claims.fns) if claims.fns is not None else None,
            agent=claims.agent,
            origin=claims.origin,
        )


def _user_from(raw: dict[str, Any]) -> _User:
    extra = dict(raw)
    user_id = extra.pop("id", None)
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    if not isinstance(user_id, str) or not 0 < len(user_id) <= 128 or not user_id.isprintable():
        raise TokenRequestError("user.id: expected a string of 1 to 128 printable characters")
    scopes = extra.pop("scopes", [])
    if (
        not isinstance(scopes, list)
        or len(scopes) > 64
        or not all(isinstance(s, str) and 0 < len(s) <= 128 for s in scopes)
    ):
        raise TokenRequestError("user.scopes: expected up to 64 strings")
    if "limits" in extra:  # the end user's own usage limits (docs/usage.md)
        try:
            extra["limits"] = msgspec.to_builtins(user_limits(extra["limits"]))
        except ValueError as exc:
            raise TokenRequestError(str(exc)) from exc
    return _User(id=user_id, scopes=tuple(scopes), claims=extra)


# ----------------------------------------------------------------------------- the gate


class Authenticator:
    """Everything a request's credential is checked against, for one gateway.

    Args:
        api_keys: the accepted API keys.
        tokens: the client-token issuer.
        agent: the agent this gateway serves (tokens must be for it).
        no_auth: serve callers without a credential, as ``anonymous`` (local
            development only). A bearer credential (``Authorization: Bearer``, or the
            key OpenAI's browser client offers as a subprotocol) that is neither a key
            nor a valid token of this gateway is then ignored, with a warning logged once:
            OpenAI's SDKs always send their own key. A token offered as a token (the
            ``gateway.token.<t>`` subprotocol, ``?token=``) is still checked.
    """

    def __init__(
        self, *, api_keys: ApiKeys, tokens: TokenIssuer, agent: str, no_auth: bool
    ) -> None:
        self.api_keys = api_keys
        self.tokens = tokens
        self.agent = agent
        self.no_auth = no_auth
        self._warned_ignored = False

    @classmethod
    def from_config(cls, config: Config, *, agent: str) -> Authenticator:
        """Check the auth settings, log what is unsafe, build the authenticator.

        Raises:
            ConfigError: no API key on a host that is not loopback, ``--no-auth`` on a
                host that is not loopback, a bad keys file or a short token secret.
                (With no API key on a loopback host the gateway serves as under
                ``--no-auth``, with the same warning.)
        """
        if config.no_auth and not is_loopback_host(config.host):
            raise ConfigError(
                f"--no-auth is for local development and binds only a loopback host "
                f"(127.0.0.1, ::1, localhost), not {config.host!r}: configure API keys instead"
            )
        api_keys = ApiKeys.from_config(config)
        no_auth = config.no_auth
        if not no_auth and not len(api_keys):
            if not is_loopback_host(config.host):
                raise ConfigError(
                    "authentication is on and no API key is configured: set --api-keys-file or "
                    "GATEWAY_API_KEYS (name:key,...) before binding a host that is not loopback"
                )
            # A gateway only this machine can reach, with no key to check, serves as under
            # --no-auth (the origin and host checks still keep web pages out): a first run
            # and the benchmark harness need no setup, and nothing is exposed.
            no_auth = True
        if config.token_secret is not None:
            secret = config.token_secret.encode()
        else:
            secret = secrets.token_bytes(MIN_SECRET_SIZE)
            log.warning(
                "token_secret_generated",
                note="no --token-secret: client tokens die with this process and are "
                "refused by other nodes",
            )
        if no_auth:
            log.warning(
                "auth_disabled",
                note=("--no-auth" if config.no_auth else "no API key configured on a loopback host")
                + ": ANYONE WHO REACHES THIS PORT CAN OPEN SESSIONS AND RUN TOOLS; "
                "for local development only",
            )
        log.info("auth_configured", api_keys=len(api_keys), no_auth=no_auth)
        tokens = TokenIssuer(secret, ttl=config.token_ttl, max_ttl=config.max_token_ttl)
        return cls(api_keys=api_keys, tokens=tokens, agent=agent, no_auth=no_auth)

    def api_key(self, authorization: str | None) -> str:
        """The name of the API key in an ``Authorization: Bearer`` header.

        Raises:
            AuthError: no bearer credential, or not a key of this gateway.
        """
        key = _bearer(authorization)
        if key is None:
            raise AuthError("an API key is required (Authorization: Bearer <key>)", label="no_key")
        name = self.api_keys.name_of(key)
        if name is None:
            raise AuthError("unknown API key", label="bad_key")
        return name

    def backend(self, authorization: str | None) -> str | None:
        """The name of the API key in an ``Authorization: Bearer`` header; ``None`` when
        auth is off and the header holds no key of this gateway (a credential that is not
        one is ignored, as in ``bearer``).

        Raises:
            AuthError: auth is on, and no bearer credential or not a key of this gateway.
        """
        try:
            return self.api_key(authorization)
        except AuthError as exc:
            if not self.no_auth:
                raise
            if exc.label != "no_key":
                self._ignore(exc)
            return None

    def bearer(self, authorization: str | None, *, origin: str | None, now: float) -> Principal:
        """The principal of an ``Authorization: Bearer`` API key or client token;
        ``anonymous`` when auth is off and there is none, or one that does not hold
        (ignored: see ``no_auth``).

        Raises:
            AuthError: auth is on, and no credential or one that does not hold.
        """
        credential = _bearer(authorization)
        if credential is None:
            if self.no_auth:
                return ANONYMOUS
            raise AuthError(
                "an API key or a client token is required (Authorization: Bearer ...)",
                label="no_token",
            )
        try:
            return self._credential(credential, origin=origin, now=now)
        except AuthError as exc:
            if not self.no_auth:
                raise
            self._ignore(exc)
            return ANONYMOUS

    def socket(
        self,
        *,
        subprotocols: Sequence[str],
        query_token: str | None,
        authorization: str | None,
        origin: str | None,
        now: float,
    ) -> Principal:
        """The principal of a WebSocket handshake: a token as the ``gateway.token.<t>``
        subprotocol or ``?token=``, or a bearer API key (or token).

        Raises:
            AuthError: no credential (auth on), or one that does not hold.
        """
        offered = [p for p in subprotocols if p.startswith(TOKEN_SUBPROTOCOL_PREFIX)]
        if len(offered) > 1:
            raise AuthError("more than one token offered", label="bad_token")
        if offered:
            token = offered[0][len(TOKEN_SUBPROTOCOL_PREFIX) :]
            return self.tokens.verify(token, now=now, agent=self.agent, origin=origin)
        if query_token is not None:
            return self.tokens.verify(query_token, now=now, agent=self.agent, origin=origin)
        return self.bearer(authorization, origin=origin, now=now)

    def _ignore(self, exc: AuthError) -> None:
        """Under ``--no-auth``: serve a caller whose credential does not hold as anonymous,
        and say so once (every OpenAI SDK client sends a key, on every socket)."""
        if self._warned_ignored:
            return
        self._warned_ignored = True
        log.warning(
            "credential_ignored",
            label=exc.label,
            reason=exc.reason,
            note="--no-auth: a bearer credential this gateway does not accept (`reason` says "
            "why) is ignored and its caller served as anonymous; logged once per process",
        )

    def _credential(self, credential: str, *, origin: str | None, now: float) -> Principal:
        name = self.api_keys.name_of(credential)
        if name is not None:
            return Principal(name=f"key:{name}", kind="api_key", key_name=name)
        if credential.count(".") == 2:  # a JWT's shape: header.payload.signature
            return self.tokens.verify(credential, now=now, agent=self.agent, origin=origin)
        raise AuthError("unknown API key", label="bad_key")


def _bearer(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None
    return credential

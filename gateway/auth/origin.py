"""Origin and Host checks at the edge, against cross-site hijacking and DNS rebinding.

A browser sends ``Origin`` with every WebSocket handshake and every cross-site (or
``fetch``) request, and a page cannot forge it. The gateway serves an Origin that
is the gateway itself (same host and port as the ``Host`` header) or one in
``allowed_origins``; requests without ``Origin`` come from non-browser clients and
are not origin-checked (they authenticate with a key or a token instead).

DNS rebinding points a name the attacker owns at 127.0.0.1: the page is then
"same-origin" with the gateway, but its ``Host`` header carries the attacker's
name. ``allowed_hosts`` refuses such names; unset, a gateway bound to a loopback
address serves loopback names only.

``OriginGuard`` is a pure ASGI middleware: it answers refused HTTP requests itself
(400 for a foreign Host, 403 for a foreign Origin; health probes are let through) and
lets WebSocket scopes through,
for the endpoint checks them with ``OriginPolicy.check`` and refuses them with a
close code its clients can read.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import structlog

__all__ = [
    "OriginGuard",
    "OriginPolicy",
    "Refusal",
    "is_loopback_host",
    "normalize_origin",
]

log = structlog.get_logger("gateway.origin")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_PROBES = frozenset({"/healthz", "/readyz"})
"""Health probes (Docker, Kubernetes) come with whatever Host they like; they hold no data."""


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def normalize_origin(value: str) -> str | None:
    """``scheme://host[:port]`` in lowercase, the default port dropped; ``None`` if
    ``value`` is not an origin (it has a path, a query, credentials or no host)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if (
        scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return (
        f"{scheme}://{host}"
        if port in (None, _DEFAULT_PORTS[scheme])
        else f"{scheme}://{host}:{port}"
    )


@functools.lru_cache(maxsize=1024)  # every socket's Host: parsed once per distinct value
def _host_and_port(host_header: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"//{host_header.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port if port is not None else default_port


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: ``host`` (DNS rebinding) or ``origin`` (cross-site)."""

    kind: str
    reason: str

    @property
    def label(self) -> str:
        """The short name logs and metrics count refusals by."""
        return "foreign_host" if self.kind == "host" else "forbidden_origin"


class OriginPolicy:
    """The Origin and Host allow-lists of one gateway.

    Args:
        allowed_origins: origins served besides the gateway's own (``*`` for any).
        allowed_hosts: ``Host`` names served (``*`` for any); ``None`` means loopback
            names when ``bind_host`` is a loopback address, any name otherwise.
        bind_host: the address the gateway listens on.
    """

    def __init__(
        self, *, allowed_origins: list[str], allowed_hosts: list[str] | None, bind_host: str
    ) -> None:
        self.any_origin = "*" in allowed_origins
        self.origins = frozenset(
            o for o in (normalize_origin(v) for v in allowed_origins if v != "*") if o
        )
        if allowed_hosts is None:
            allowed_hosts = sorted(_LOOPBACK_NAMES) if is_loopback_host(bind_host) else ["*"]
        self.any_host = "*" in allowed_hosts
        self.hosts = frozenset(h.strip("[]").lower() for h in allowed_hosts if h != "*")

    @classmethod
    def from_settings(
        cls, allowed_origins: str | None, allowed_hosts: str | None, bind_host: str
    ) -> OriginPolicy:
        """From the comma-separated ``allowed_origins`` and ``allowed_hosts`` settings."""
        return cls(
            allowed_origins=_split(allowed_origins) or [],
            allowed_hosts=_split(allowed_hosts),
            bind_host=bind_host,
        )

    def check(self, scope: Scope) -> Refusal | None:
        """The refusal of an HTTP or WebSocket request, or ``None`` to serve it."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        secure = scope.get("scheme") in ("https", "wss")
        address = _host_and_port(host, 443 if secure else 80)
        if not self.any_host and (address is None or address[0].strip("[]") not in self.hosts):
            return Refusal("host", f"host {host[:100]!r} is not served here")
        origin = headers.get("origin")
        if origin is None or self.any_origin:
            return None  # not a browser: the credential decides
        normalized = normalize_origin(origin)
        if normalized is not None and (normalized in self.origins or self._same(normalized, host)):
            return None
        return Refusal("origin", f"origin {origin[:100]!r} is not allowed")

    @staticmethod
    def _same(origin: str, host: str) -> bool:
        parts = urlsplit(origin)
        scheme = parts.scheme
        address = _host_and_port(host, _DEFAULT_PORTS[scheme])
        port = parts.port or _DEFAULT_PORTS[scheme]
        return address is not None and address == ((parts.hostname or "").lower(), port)


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


class OriginGuard:
    """ASGI middleware: refuses HTTP requests ``policy`` refuses (400 host, 403 origin)."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] not in _PROBES
            and (refusal := self.policy.check(scope)) is not None
        ):
            status, code = (
                (400, "bad_host") if refusal.kind == "host" else (403, "forbidden_origin")
            )
            log.info("request_refused", label=refusal.label, path=scope["path"][:200])
            body = json.dumps({"error": refusal.reason, "code": code}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

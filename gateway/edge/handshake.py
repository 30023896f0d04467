"""Admit or refuse: the handshake every socket endpoint shares, whatever its wire protocol.

A socket is admitted when its Host and Origin are served here (``gateway.auth.origin``), it
offers the endpoint's subprotocol (if the endpoint asks for it), the gateway is not shutting
down, its credential holds (``gateway.auth.credentials``: the principal it proves owns the
session, and only the same principal may resume it) and its client address has a socket to
spare (``max_sockets_per_ip``; the address a trusted proxy forwards, see
``forwarded_allow_ips``). Once accepted, its new session is admitted by the runtime's
session quotas (``open_session``).

Every refusal goes through ``refuse``: one log line, one count in the metrics, and the close
of its cause from the one close table (``gateway.errors``), so that every endpoint closes
the same way for the same cause.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog
from starlette.websockets import WebSocket, WebSocketState

from gateway.auth.credentials import AuthError
from gateway.errors import CloseCode, Closing, StoreUnavailable, TooManySessions, closing, of_error
from gateway.shell.connection import ABORT_SCOPE_KEY, FRAME_WRITER_SCOPE_KEY, Connection

if TYPE_CHECKING:
    from gateway.auth.admission import AddressCounter
    from gateway.core.event import Event
    from gateway.core.principal import Principal
    from gateway.shell.driver import Driver
    from gateway.shell.runtime import Runtime

__all__ = ["Admission", "accept", "admit", "open_session", "refuse", "refuse_expired"]

log = structlog.get_logger("gateway.transport")

_MAX_REASON_SIZE = 123
"""Bytes of a close frame's reason, at most (RFC 6455)."""


class Admission:
    """An admitted socket: the principal its credential proves, and its place among the
    open sockets of its client address, given back by ``release`` when it goes."""

    __slots__ = ("_address", "_sockets", "principal")

    def __init__(self, principal: Principal, sockets: AddressCounter, address: str | None) -> None:
        self.principal = principal
        self._sockets = sockets
        self._address = address

    def release(self) -> None:
        """The socket is gone: its address may open another."""
        if self._address is not None:
            self._sockets.release(self._address)


async def admit(
    runtime: Runtime,
    websocket: WebSocket,
    *,
    protocol: str,
    exclusive: bool,
    bearer: str | None = None,
) -> Admission | None:
    """Admit a socket in its handshake, or refuse it (and return ``None``).

    Args:
        runtime: the gateway's runtime.
        websocket: the socket, not accepted yet.
        protocol: the subprotocol the endpoint speaks; a refusal made after an accept
            chooses it too, when the client offered it.
        exclusive: refuse a client that offers subprotocols but not ``protocol`` (HTTP
            403): one asking only for others (say a future ``gateway.v2``) must not be
            served this one by surprise.
        bearer: a credential the endpoint's protocol carries elsewhere than the
            ``Authorization`` header (OpenAI's browser client: in a subprotocol), taken
            in its place.
    """
    scope = websocket.scope
    offered = scope.get("subprotocols") or []
    if (refusal := runtime.origins.check(scope)) is not None:
        # A foreign Host (DNS rebinding) is refused at the handshake; a foreign Origin
        # is told why, with 4003, so that the page's developer can see it.
        close = closing(refusal.label, refusal.reason)
        await refuse(runtime, websocket, close, protocol=protocol)
        return None
    if exclusive and offered and protocol not in offered:
        await refuse(runtime, websocket, closing("bad_subprotocol"), protocol=protocol)
        return None
    if runtime.closing:
        await refuse(runtime, websocket, closing("shutting_down"), protocol=protocol)
        return None
    try:
        principal = runtime.auth.socket(
            subprotocols=offered,
            # Parsed only when there is one: most sockets have no query string.
            query_token=websocket.query_params.get("token") if scope.get("query_string") else None,
            authorization=(
                f"Bearer {bearer}" if bearer is not None else websocket.headers.get("authorization")
            ),
            origin=websocket.headers.get("origin"),
            now=time.time(),
        )
    except AuthError as exc:
        await refuse(runtime, websocket, of_error(exc), protocol=protocol)
        return None
    # No address on a Unix socket: nothing to count by.
    address = websocket.client.host if websocket.client is not None else None
    if address is not None and not runtime.sockets.acquire(address):
        await refuse(runtime, websocket, closing("too_many_sockets"), protocol=protocol)
        return None
    return Admission(principal, runtime.sockets, address)


async def accept(runtime: Runtime, websocket: WebSocket, protocol: str) -> Connection:
    """Accept an admitted socket (with ``protocol`` when the client offered it) and wrap it
    with this gateway's outbound bounds."""
    offered = websocket.scope.get("subprotocols") or []
    # Never the token subprotocol: the chosen one is echoed back in the response.
    await websocket.accept(subprotocol=protocol if protocol in offered else None)
    return runtime.connection(
        websocket,
        abort=websocket.scope.get(ABORT_SCOPE_KEY),
        frame_writer=websocket.scope.get(FRAME_WRITER_SCOPE_KEY),
    )


async def refuse(
    runtime: Runtime,
    websocket_or_conn: WebSocket | Connection,
    close: Closing,
    *,
    protocol: str | None = None,
) -> None:
    """Refuse a socket with ``close`` (``gateway.errors``): log ``connection_refused`` and
    count it by its label.

    A ``Connection`` (an accepted socket) closes with its code and reason. A WebSocket
    still in its handshake is refused there (HTTP 403, no reason) when the code is 1008;
    for any other code it is accepted first (with the subprotocol ``protocol`` when the
    client offered it), so that the client can read the code and the reason.
    """
    code, label = close.code, close.label
    log.info("connection_refused", label=label, close_code=int(code))
    runtime.note_refusal(label)
    reason = close.reason.encode()[:_MAX_REASON_SIZE].decode(errors="ignore")
    if isinstance(websocket_or_conn, Connection):
        websocket_or_conn.close(code, reason)
        return
    websocket = websocket_or_conn
    if websocket.client_state is WebSocketState.CONNECTING:
        if code == CloseCode.POLICY:
            await websocket.close(code=code)
            return
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=protocol if protocol in offered else None)
    await websocket.close(code=code, reason=reason)


async def open_session(
    runtime: Runtime, conn: Connection, principal: Principal, first: Event
) -> Driver | None:
    """A new session of ``principal`` with ``conn`` as its socket and ``first`` as its
    first message; ``None`` once the socket is refused (a session quota, a shutdown, the
    store not answering, or the session ended before it took the socket)."""
    try:
        driver = await runtime.start_session(principal)
    except (TooManySessions, StoreUnavailable) as exc:
        await refuse(runtime, conn, of_error(exc))
        return None
    # The first message goes in right behind the attach: one turn of the session's loop
    # takes both, and sends session.created first.
    accepted = driver.attach_soon(conn)
    driver.feed(first)
    if not await accepted:
        await refuse_expired(runtime, conn)
        return None
    return driver


async def refuse_expired(runtime: Runtime, conn: Connection) -> None:
    """Refuse a socket whose session ended before taking it (its TTL ran out, it was
    stopped) with 4008: an attach always gets an answer, never silence."""
    await refuse(runtime, conn, closing("session_expired"))

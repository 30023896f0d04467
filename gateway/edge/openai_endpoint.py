"""``/v1/openai/realtime``: the OpenAI Realtime protocol (GA: text, audio and function
calls) on the same session core and voice pipeline, for apps built on OpenAI's SDKs.

The handshake is v1's, shared (``gateway.edge.handshake``): Host and Origin, the
credential (``Authorization: Bearer``, which OpenAI's SDKs send, a client token as
``?token=`` or ``gateway.token.<t>``, or the browser's ``openai-insecure-api-key.<t>``
subprotocol), the sockets per address, then the session quotas; any subprotocol is served.
Frames go through v1's reader (rate and size limits) with an ``OpenAIRealtimeCodec`` to
decode them, and the session's events through the same codec on their way out
(``Connection.codec``).

The session starts with the socket: ``session.created`` is its first event. The protocol
has no resume, so when the socket closes the session ends.
"""

from __future__ import annotations

import functools
import importlib.util
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import structlog
from starlette.websockets import WebSocket

from gateway.core.principal import Principal
from gateway.edge.handshake import accept, admit, open_session
from gateway.edge.v1_endpoint import BINARY_REFUSED, close_out, pump, reader_for
from gateway.voice import g711
from gateway.wire.openai.audio import Converter, Converters
from gateway.wire.openai.codec import OpenAIRealtimeCodec
from gateway.wire.v1 import DecodeFailure, Inbound, SessionStart

if TYPE_CHECKING:
    from gateway.shell.driver import Driver
    from gateway.shell.runtime import Runtime

__all__ = ["OPENAI_REALTIME_PATH", "openai_realtime_endpoint"]

log = structlog.get_logger("gateway.openai_endpoint")

OPENAI_REALTIME_PATH = "/v1/openai/realtime"
"""OpenAI's SDKs append ``/realtime`` to their ``websocket_base_url``: point them at
``ws(s)://HOST/v1/openai``."""
_SUBPROTOCOL = "realtime"
"""What OpenAI's browser client offers, beside its key; chosen when offered."""
_KEY_PREFIX = "openai-insecure-api-key."
"""The subprotocol a browser carries its credential in (a gateway client token here)."""


async def openai_realtime_endpoint(websocket: WebSocket) -> None:
    """``GET /v1/openai/realtime[?model=...]``: one session per socket."""
    runtime: Runtime = websocket.app.state.runtime
    offered: list[str] = websocket.scope.get("subprotocols") or []
    keys = [p[len(_KEY_PREFIX) :] for p in offered if p.startswith(_KEY_PREFIX)]
    admitted = await admit(
        runtime,
        websocket,
        protocol=_SUBPROTOCOL,
        exclusive=False,
        bearer=keys[0] if keys else None,
    )
    if admitted is None:
        return
    model = websocket.query_params.get("model") or runtime.agent.name
    try:
        await _serve(runtime, websocket, admitted.principal, model)
    finally:
        admitted.release()


async def _serve(runtime: Runtime, websocket: WebSocket, principal: Principal, model: str) -> None:
    """Accept an admitted socket, start its session and run it until either ends."""
    conn = await accept(runtime, websocket, _SUBPROTOCOL)
    codec = OpenAIRealtimeCodec(
        model=model,
        new_id=_new_id,
        max_pending_chars=runtime.config.max_message_chars,
        converters=_g711_converters(),
    )
    conn.codec = codec

    def decode(text: str | bytes) -> list[Inbound | DecodeFailure | bytes]:
        if isinstance(text, bytes):  # the protocol's events are JSON text frames
            return [BINARY_REFUSED]
        decoded = codec.decode(text)
        for frame in decoded.replies:
            conn.send(None, frame)
        return decoded.messages

    reader = reader_for(runtime, websocket, conn, decode)
    try:
        # session.created is the first event: the protocol has no first message.
        driver = await open_session(runtime, conn, principal, SessionStart())
        if driver is not None:
            codec.call_args = _call_args(driver)
            structlog.contextvars.bind_contextvars(session_id=driver.session_id)
            log.info(
                "socket_attached",
                client=str(websocket.client),
                principal=principal.name,
                protocol="openai-realtime",
            )
            await pump(reader, driver, conn)
            driver.detach(conn, end=True)  # no resume in this protocol
            log.info("socket_closed", client_code=reader.close_code, server_code=conn.close_code)
    finally:
        await close_out(reader, conn)


def _call_args(driver: Driver) -> Callable[[str], dict[str, Any] | None]:
    """Looks up a server tool call's arguments in the session's calls, for its item."""

    def call_args(call_id: str) -> dict[str, Any] | None:
        call = driver.session.call(call_id)
        return call.args if call is not None else None

    return call_args


@functools.cache
def _g711_converters() -> Converters | None:
    """G.711 to and from PCM16, when this gateway has what it takes (the ``voice`` extra's
    numpy and soxr); else sessions may use PCM only."""
    if not all(importlib.util.find_spec(name) for name in ("numpy", "soxr")):
        return None

    def converter(law: str, rate: int, inbound: bool) -> Converter:
        assert law in ("pcmu", "pcma")
        return g711.converter(cast(g711.Law, law), rate, inbound=inbound)

    return converter


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(12)}"

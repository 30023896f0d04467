"""The WebSocket endpoint: frames in and out of a Driver.

The transport decodes client frames (validation happens here, at the edge),
feeds them to the driver, and writes the driver's events to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.driver import Driver
from gateway.errors import CloseCode
from gateway.event import Disconnected
from gateway.protocol import SUBPROTOCOL, DecodeFailure, decode_client

__all__ = ["realtime_endpoint"]

log = structlog.get_logger("gateway.transport")


async def realtime_endpoint(websocket: WebSocket) -> None:
    """``GET /v1/realtime``: one conversation per socket."""
    runtime = websocket.app.state.runtime
    offered = websocket.scope.get("subprotocols") or []
    if offered and SUBPROTOCOL not in offered:
        # A client asking only for other protocols (say a future gateway.v2) must not be
        # served v1 by surprise; closing before accept refuses the handshake (HTTP 403).
        log.info("subprotocol_refused", offered=offered[:4])
        await websocket.close(code=CloseCode.POLICY)
        return
    await websocket.accept(subprotocol=SUBPROTOCOL if offered else None)
    session = runtime.new_session()

    async def send(data: bytes) -> None:
        # A vanished client is noticed by the receive loop; here it only stops sends.
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(data.decode())

    with structlog.contextvars.bound_contextvars(session_id=session.session_id):
        driver = runtime.new_driver(session, send)
        log.info("session_connected", client=str(websocket.client))
        runtime.attach(driver)
        try:
            close_code = await _serve(websocket, driver)
        finally:
            runtime.detach(driver)
        log.info("session_closed", close_code=close_code)


async def _serve(websocket: WebSocket, driver: Driver) -> int:
    """Run the driver and the receive loop until one ends; return the close code."""
    runner = asyncio.create_task(driver.run(), name="gateway:driver")
    receiver = asyncio.create_task(_receive(websocket, driver), name="gateway:receive")
    try:
        done, _ = await asyncio.wait({runner, receiver}, return_when=asyncio.FIRST_COMPLETED)
        if receiver in done:
            if receiver.exception() is not None:
                log.error("receive_failed", error=repr(receiver.exception()))
            driver.feed(Disconnected())
            return await _finish(runner)
        receiver.cancel()
        close_code = await _finish(runner)
        with contextlib.suppress(RuntimeError, OSError):
            await websocket.close(code=close_code)
        return close_code
    finally:
        # Also on cancellation (server shutdown): nothing of the session outlives it.
        for task in (runner, receiver):
            task.cancel()
        await asyncio.gather(runner, receiver, return_exceptions=True)


async def _receive(websocket: WebSocket, driver: Driver) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            driver.feed(
                DecodeFailure(
                    code="invalid_message",
                    message="binary frames are not supported; send JSON text frames",
                )
            )
        else:
            driver.feed(decode_client(text))


async def _finish(runner: asyncio.Task[None]) -> int:
    """Wait for the driver; a crash in it is our bug: log it, close 1011."""
    try:
        await runner
    except Exception:
        log.exception("session_crashed")
        return CloseCode.INTERNAL
    return CloseCode.NORMAL

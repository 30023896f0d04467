"""HTTP request bodies read with a size bound: the one body reader of the HTTP edge.

``read_body`` refuses a declared ``Content-Length`` over the bound before reading a byte,
and stops a streamed (chunked) body as soon as it passes the bound, so a client can make
the gateway hold at most ``max_size`` bytes plus one chunk. The app turns ``BodyTooLarge``
into HTTP 413 with ``body_too_large`` (registered in ``create_app``) and closes the
connection, so the rest of the body is never read.
"""

from __future__ import annotations

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = structlog.get_logger("gateway.app")

__all__ = ["BodyTooLarge", "body_too_large", "client_gone", "read_body"]


class BodyTooLarge(Exception):
    """A request body is larger than allowed."""

    def __init__(self, max_size: int) -> None:
        super().__init__(f"request body over {max_size} bytes")
        self.max_size = max_size


async def read_body(request: Request, max_size: int | None) -> bytes:
    """The request's body, at most ``max_size`` bytes (``None``: no bound).

    Raises:
        BodyTooLarge: the declared or the streamed body is larger than ``max_size``.
    """
    if max_size is None:
        return await request.body()
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_size:
        raise BodyTooLarge(max_size)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_size:
            raise BodyTooLarge(max_size)
        chunks.append(chunk)
    return b"".join(chunks)


async def body_too_large(request: Request, exc: Exception) -> Response:
    """Starlette exception handler: HTTP 413, and the connection closes (no more body)."""
    limit = exc.max_size if isinstance(exc, BodyTooLarge) else 0
    return JSONResponse(
        {"error": f"body_too_large: the request body is over {limit} bytes"},
        status_code=413,
        headers={"connection": "close"},
    )


async def client_gone(request: Request, exc: Exception) -> Response:
    """Starlette exception handler for ``ClientDisconnect``: the client went away before
    its body was whole. Nobody is left to answer, and it is no failure of the gateway's
    (not an error with a traceback): logged at info, and an empty 400 for the record."""
    log.info("client_gone_mid_request", path=request.url.path)
    return Response(status_code=400)

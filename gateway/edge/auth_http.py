"""The HTTP side of authentication: minting client tokens, guarding endpoints.

``POST /v1/sessions`` (API key) mints a client token for a browser or app;
``POST /v1/dev/token`` (no key) does the same for the web demo, and exists only
under ``--no-auth``. ``guard_bearer`` and ``guard_tool_test`` check the other
endpoints' credentials. Errors are JSON: ``{"error": reason, "code": code}``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from gateway.auth.credentials import AuthError, TokenRequest, TokenRequestError
from gateway.edge.body import BodyTooLarge, read_body

if TYPE_CHECKING:
    from gateway.shell.runtime import Runtime

__all__ = ["MAX_TOKEN_REQUEST_SIZE", "auth_routes", "guard_bearer", "guard_tool_test"]

log = structlog.get_logger("gateway.auth")

MAX_TOKEN_REQUEST_SIZE = 64 * 2**10
"""Largest body of a token request, in bytes (413 past it)."""
_DEV_KEY_NAME = "dev"


def _error(status: int, code: str, reason: str) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": reason, "code": code}, status_code=status, headers=headers)


def _unauthorized(exc: AuthError) -> JSONResponse:
    log.info("request_refused", label=exc.label)
    return _error(401, exc.code, exc.reason)


def guard_bearer(runtime: Runtime, request: Request) -> JSONResponse | None:
    """``None`` when the request carries a valid API key or client token (or needs none,
    under ``--no-auth``, where a credential that does not hold is ignored); else the 401 to
    answer."""
    try:
        runtime.auth.bearer(
            request.headers.get("authorization"),
            origin=request.headers.get("origin"),
            now=time.time(),
        )
    except AuthError as exc:
        return _unauthorized(exc)
    return None


def guard_tool_test(runtime: Runtime, request: Request) -> JSONResponse | None:
    """``None`` when the request carries a valid API key (or anything, under ``--no-auth``,
    where a credential that is no key is ignored); else the 401 to answer. Running tools is
    for backends, so tokens do not do."""
    try:
        runtime.auth.backend(request.headers.get("authorization"))
    except AuthError as exc:
        return _unauthorized(exc)
    return None


async def _mint(runtime: Runtime, request: Request, key_name: str) -> JSONResponse:
    try:
        body = await read_body(request, MAX_TOKEN_REQUEST_SIZE)
        token_request = msgspec.json.decode(body or b"{}", type=TokenRequest)
        if key_name == _DEV_KEY_NAME and token_request.origin is None:
            # The demo page asks from its own origin: bind the token to it.
            origin = request.headers.get("origin")
            token_request = msgspec.structs.replace(token_request, origin=origin)
        minted = runtime.auth.tokens.mint(
            key_name, token_request, agent=runtime.agent.name, now=time.time()
        )
    except BodyTooLarge:
        return _error(413, "body_too_large", f"the body exceeds {MAX_TOKEN_REQUEST_SIZE} bytes")
    except msgspec.ValidationError as exc:
        return _error(422, "invalid_request", str(exc))
    except msgspec.DecodeError as exc:
        return _error(400, "invalid_request", f"the body is not JSON: {exc}")
    except TokenRequestError as exc:
        return _error(422, "invalid_request", str(exc))
    log.info(
        "client_token_issued",
        key_name=key_name,
        jti=minted.jti,
        expires_at=minted.expires_at,
        user=token_request.user is not None,
    )
    scheme = "wss" if request.url.scheme in ("https", "wss") else "ws"
    url = f"{scheme}://{request.url.netloc}/v1/realtime"
    return JSONResponse(
        {
            "token": minted.token,
            "expires_at": minted.expires_at,
            "agent": minted.agent,
            "url": url,
        },
        status_code=201,
    )


def auth_routes(runtime: Runtime) -> list[BaseRoute]:
    """``POST /v1/sessions`` and ``POST /v1/dev/token`` (404 unless ``--no-auth``)."""

    async def create_session_token(request: Request) -> JSONResponse:
        try:
            key_name = runtime.auth.api_key(request.headers.get("authorization"))
        except AuthError as exc:
            return _unauthorized(exc)
        return await _mint(runtime, request, key_name)

    async def dev_token(request: Request) -> JSONResponse:
        if not runtime.auth.no_auth:
            return _error(404, "not_found", "Not Found")
        return await _mint(runtime, request, _DEV_KEY_NAME)

    return [
        Route("/v1/sessions", create_session_token, methods=["POST"]),
        Route("/v1/dev/token", dev_token, methods=["POST"]),
    ]

"""``DELETE /v1/sessions/{session_id}``: end a session without a socket.

For a client that has no socket to close normally (a phone between two resumes, an app
closing while the network is slow) and for the backend that owns the session. The
credential, as ``Authorization: Bearer``, is the session's resume token or an API key
of the session's owner: the key that created it, or that minted the client token it was
created with. The session id alone never suffices, ``--no-auth`` or not.

Answers: 204 when the session is ended (now, or already: repeating is harmless); 404
for an id never seen and for a credential that does not hold, alike, so that the answer
tells nobody without the credential whether the session exists; 401 with no bearer
credential at all; 503 when the store does not answer. An ended session's resume token
cannot be checked any more (the store keeps only that the session existed), so a repeat
is 204 whatever bearer credential it carries: it ends nothing, and tells only that this
id belonged to a session that has ended.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.errors import StoreUnavailable
from gateway.shell.cluster import token_hash
from gateway.store import SessionRecord

if TYPE_CHECKING:
    from gateway.shell.runtime import Runtime

__all__ = ["session_routes"]

log = structlog.get_logger("gateway.auth")


def _error(status: int, code: str, reason: str) -> JSONResponse:
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": reason, "code": code}, status_code=status, headers=headers)


def _bearer(authorization: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer <credential>`` header, if any."""
    scheme, _, credential = (authorization or "").strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None
    return credential


def _owned_by_key(principal: str, key_name: str) -> bool:
    """Whether the key ``key_name`` owns a session of ``principal``: it is the key's
    (``key:<name>``) or one of the end users it minted tokens for (``key:<name>/user:<id>``).
    Key names hold no ``/`` (``gateway.auth.api_key``), so the prefix is unambiguous."""
    owner = f"key:{key_name}"
    return principal == owner or principal.startswith(owner + "/")


def _may_end(runtime: Runtime, record: SessionRecord, credential: str) -> str | None:
    """How ``credential`` proves the right to end the session of ``record`` (``token``,
    ``api_key``), or ``None``."""
    # Both checks run whatever the first found, so timing tells nothing of which held.
    token = hmac.compare_digest(record.token_hash.encode(), token_hash(credential).encode())
    key_name = runtime.auth.api_keys.name_of(credential)  # constant time, every key
    if token:
        return "token"
    if key_name is not None and _owned_by_key(record.principal, key_name):
        return "api_key"
    return None


def session_routes(runtime: Runtime) -> list[BaseRoute]:
    """``DELETE /v1/sessions/{session_id}``."""

    async def delete_session(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        credential = _bearer(request.headers.get("authorization"))
        if credential is None:
            return _error(
                401,
                "unauthorized",
                "the session's resume token or an API key is required (Authorization: Bearer ...)",
            )
        try:
            record = await runtime.store.get_session(session_id)
            if record is None:
                if await runtime.store.ended(session_id):
                    return Response(status_code=204)  # ended already: nothing left to do
                return _not_found()
            proof = _may_end(runtime, record, credential)
            if proof is None:
                log.info("session_delete_refused", session_id=session_id)
                return _not_found()
            await runtime.end_session(session_id)
        except StoreUnavailable:
            return _error(503, "store_unavailable", "the session store does not answer")
        log.info("session_deleted", session_id=session_id, proof=proof)
        return Response(status_code=204)

    return [Route("/v1/sessions/{session_id}", delete_session, methods=["DELETE"])]


def _not_found() -> JSONResponse:
    return _error(404, "not_found", "no such session, or not yours to end")

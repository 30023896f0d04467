"""``GET /v1/usage``: what was spent, by key, end user, agent and model, over a time range.

For backends: the credential is an API key (``Authorization: Bearer``), and a key reads its
own usage (its end users' included) unless the limits file names it in ``[usage] readers``,
which read every key's (and may filter one with ``key=``). Under ``--no-auth`` everything
is readable. Query parameters:

- ``start``, ``end``: Unix seconds or ISO 8601 (``2026-12-05T00:00:00Z``); the last 24 h
  by default. Usage is kept by the hour: an hour counts when it starts in the range.
- ``group_by``: which of ``key,end_user,agent,model`` to keep apart (all by default);
  the others are summed over.
- ``key``: one key's usage (a reader's filter).

The answer: ``rows`` (one per group, sorted), and ``total``. ``cost`` is ``null`` when a
step in the row had no price (its model is not in ``[prices]``): never a partial sum
passed off as the total; ``priced_cost`` is the sum of the priced steps.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.auth.credentials import AuthError
from gateway.core.usage import MICRO, Attribution, Tally
from gateway.errors import StoreUnavailable

if TYPE_CHECKING:
    from gateway.shell.runtime import Runtime

__all__ = ["usage_routes"]

log = structlog.get_logger("gateway.usage")

_GROUPS = ("key", "end_user", "agent", "model")
_DAY = 86_400.0


class _BadQuery(ValueError):
    pass


def _instant(raw: str | None, default: float, name: str) -> float:
    if raw is None:
        return default
    try:
        instant = float(raw)
    except ValueError:
        pass
    else:
        if not math.isfinite(instant) or not 0 <= instant < 2**33:
            raise _BadQuery(f"{name}: not a time: {raw[:40]!r}")
        return instant
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise _BadQuery(f"{name}: expected Unix seconds or ISO 8601, got {raw[:40]!r}") from exc
    if parsed.tzinfo is None:
        raise _BadQuery(f"{name}: give a time zone (Z for UTC)")
    return parsed.timestamp()


def _group_by(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return _GROUPS
    groups = tuple(part.strip() for part in raw.split(",") if part.strip())
    unknown = [group for group in groups if group not in _GROUPS]
    if unknown:
        raise _BadQuery(f"group_by: {unknown[0][:40]!r} is not one of {', '.join(_GROUPS)}")
    return tuple(group for group in _GROUPS if group in groups)


def usage_row(tally: Tally) -> dict[str, Any]:
    """A tally as the API says it: money in currency units, audio in seconds."""
    priced = tally.cost / MICRO
    return {
        "steps": tally.steps,
        "input_tokens": tally.input_tokens,
        "output_tokens": tally.output_tokens,
        "cached_input_tokens": tally.cached_input_tokens,
        "input_audio_tokens": tally.input_audio_tokens,
        "output_audio_tokens": tally.output_audio_tokens,
        "cost": None if tally.unpriced_steps else priced,
        "priced_cost": priced,
        "unpriced_steps": tally.unpriced_steps,
        "tool_calls": dict(sorted(tally.tool_calls.items())),
        "audio_in_seconds": tally.audio_in_ms / 1000,
        "audio_out_seconds": tally.audio_out_ms / 1000,
    }


def _grouped(
    totals: list[tuple[Attribution, Tally]], groups: tuple[str, ...]
) -> list[dict[str, Any]]:
    rows: dict[tuple[str, ...], Tally] = {}
    for who, tally in totals:
        group = tuple(getattr(who, name) for name in groups)
        rows.setdefault(group, Tally()).add(tally)
    return [
        {**dict(zip(groups, group, strict=True)), **usage_row(tally)}
        for group, tally in sorted(rows.items())
    ]


def usage_routes(runtime: Runtime) -> list[BaseRoute]:
    """``GET /v1/usage``."""

    async def usage(request: Request) -> Response:
        try:
            key = runtime.auth.backend(request.headers.get("authorization"))
        except AuthError as exc:
            return JSONResponse(
                {"error": exc.reason, "code": exc.label},
                status_code=401,
                headers={"www-authenticate": "Bearer"},
            )
        query = request.query_params
        now = time.time()
        try:
            end = _instant(query.get("end"), now, "end")
            start = _instant(query.get("start"), end - _DAY, "start")
            if start >= end:
                raise _BadQuery("start: must be before end")
            groups = _group_by(query.get("group_by"))
            wanted = query.get("key")
            reads_all = key is None or runtime.budgets.may_read_all(key)
            if not reads_all:
                if wanted is not None and wanted != key:
                    return JSONResponse(
                        {"error": "this key reads only its own usage", "code": "forbidden"},
                        status_code=403,
                    )
                wanted = key
            totals = await runtime.meter.ledger.totals(start=start, end=end, key=wanted)
        except (_BadQuery, ValueError) as exc:
            return JSONResponse({"error": str(exc), "code": "bad_query"}, status_code=400)
        except StoreUnavailable as exc:
            log.warning("usage_unreadable", error=str(exc))
            return JSONResponse(
                {"error": "usage cannot be read now", "code": "store_unavailable"},
                status_code=503,
            )
        total = Tally()
        for _, tally in totals:
            total.add(tally)
        return JSONResponse(
            {
                "start": start,
                "end": end,
                "group_by": list(groups),
                "rows": _grouped(totals, groups),
                "total": usage_row(total),
            }
        )

    return [Route("/v1/usage", usage)]

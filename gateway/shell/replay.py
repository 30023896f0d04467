"""What a resuming client is sent before any live event: the events it missed, from the log.

A resume names the last ``seq`` the client has. The events after it are read from the
session's log (under its lease, with a durable store) and replayed, after a
``session.resumed`` that says where the replay starts and what is still open. Should some
be gone (trimmed, expired, never taken while the store was down) or the client be ahead of
the session, it gets the ``resume_gap`` error and a snapshot to rebuild from instead.
"""

from __future__ import annotations

import msgspec
import structlog

from gateway.core.session import Session
from gateway.errors import StoreUnavailable
from gateway.shell.connection import Connection
from gateway.shell.effects import calls_for, for_device
from gateway.store import Lease, Store
from gateway.wire.v1 import (
    Error,
    ServerMsg,
    SessionAttached,
    SessionResumed,
    decode_server,
    encode,
)

__all__ = ["missed", "replay"]

log = structlog.get_logger("gateway.driver")


async def missed(
    store: Store, session: Session, lease: Lease | None, last_seq: int
) -> tuple[list[bytes] | None, StoreUnavailable | None]:
    """The logged events after ``last_seq`` (``None``: some are gone, or the client is
    ahead), read under the session's lease, and the store's failure if it failed.

    Raises:
        LeaseLost: the lease is no longer this node's: nothing may be replayed from
            here (the log may hold events this session never had).
    """
    if last_seq > session.last_seq and lease is None:
        return None, None
    try:
        events = await store.events_after(session.session_id, last_seq, lease=lease)
    except StoreUnavailable as exc:  # the live session rebuilds the client instead
        return None, exc
    return (events if last_seq <= session.last_seq else None), None


def replay(
    conn: Connection,
    session: Session,
    last_seq: int,
    events: list[bytes] | None,
    now: float,
    *,
    joined: int | None = None,
    declared: frozenset[str] | None = None,
) -> tuple[ServerMsg, ...]:
    """Send a resuming client what it missed (``events``, from ``missed``), before any
    live event; or the ``resume_gap`` error and a snapshot if it cannot be replayed.

    Args:
        joined: for a device that joined the session (``session.attach``): how many sockets
            are attached now; it is answered ``session.attached`` instead of
            ``session.resumed``.
        declared: when several devices share the session, the functions they declared in
            all: ``conn`` gets only the calls of its device's (``Connection.functions``)
            and of no device's.

    Returns:
        The events made for this replay, for the session's observers (the replayed ones
        were observed when first sent).
    """
    head = session.last_seq
    if events is not None and len(events) != head - last_seq:
        events = None  # a hole: events the store did not take while it was down
    if events is None:
        log.info("resume_gap", last_seq=last_seq, head=head)
        why = (
            f"last_seq {last_seq} is ahead of this session (newest seq {head})"
            if last_seq > head
            else f"events after seq {last_seq} are gone"
        )
        error = Error(code="resume_gap", message=f"{why}; rebuild from the snapshot")
        snapshot = session.snapshot(now)
        if conn.device is not None:
            snapshot = msgspec.structs.replace(snapshot, device_id=conn.device)
        if declared is not None and conn.functions is not None:
            open_calls = calls_for(snapshot.open_calls, conn.functions, declared)
            snapshot = msgspec.structs.replace(snapshot, open_calls=open_calls)
        conn.replay(encode(error))
        conn.replay(encode(snapshot))
        return error, snapshot
    functions = conn.functions if declared is not None else None
    open_calls = session.open_client_calls(now)
    if functions is not None and declared is not None:
        open_calls = calls_for(open_calls, functions, declared)
    answer: SessionResumed | SessionAttached
    if joined is None:
        answer = SessionResumed(
            session_id=session.session_id,
            replayed_from=last_seq + 1,
            last_seq=head,
            agent=session.agent,
            open_calls=open_calls,
            open_confirmations=session.open_confirmations(now),
            device_id=conn.device,
        )
    else:
        answer = SessionAttached(
            session_id=session.session_id,
            device_id=conn.device or "",
            replayed_from=last_seq + 1,
            last_seq=head,
            agent=session.agent,
            open_calls=open_calls,
            open_confirmations=session.open_confirmations(now),
            devices=joined,
        )
    conn.replay(encode(answer))
    for data in events:
        if functions is not None and declared is not None and _TOOL_CALLS in data:
            data = for_device(decode_server(data), data, functions, declared)[1]
        conn.replay(data)
    log.info("session_resumed", last_seq=last_seq, replayed=len(events), joined=joined)
    return (answer,)


_TOOL_CALLS = b'"type":"tool.calls"'
"""In the bytes of every logged ``tool.calls`` (and of few other events: a tool's own
arguments might hold it): a cheap test before the decode that tells for sure."""

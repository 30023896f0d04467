"""What a resuming client is sent before any live event: the events it missed, from the log.

A resume names the last ``seq`` the client has. The events after it are read from the
session's log (under its lease, with a durable store) and replayed, after a
``session.resumed`` that says where the replay starts and what is still open. Should some
be gone (trimmed, expired, never taken while the store was down) or the client be ahead of
the session, it gets the ``resume_gap`` error and a snapshot to rebuild from instead.
"""

from __future__ import annotations

import structlog

from gateway.core.session import Session
from gateway.errors import StoreUnavailable
from gateway.shell.connection import Connection
from gateway.store import Lease, Store
from gateway.wire.v1 import Error, ServerMsg, SessionResumed, encode

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
    conn: Connection, session: Session, last_seq: int, events: list[bytes] | None, now: float
) -> tuple[ServerMsg, ...]:
    """Send a resuming client what it missed (``events``, from ``missed``), before any
    live event; or the ``resume_gap`` error and a snapshot if it cannot be replayed.

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
        conn.replay(encode(error))
        conn.replay(encode(snapshot))
        return error, snapshot
    resumed = SessionResumed(
        session_id=session.session_id,
        replayed_from=last_seq + 1,
        last_seq=head,
        agent=session.agent,
        open_calls=session.open_client_calls(now),
        open_confirmations=session.open_confirmations(now),
    )
    conn.replay(encode(resumed))
    for data in events:
        conn.replay(data)
    log.info("session_resumed", last_seq=last_seq, replayed=len(events))
    return (resumed,)

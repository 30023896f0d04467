"""A session's sockets as devices: several may share one session (``session.attach``).

Every socket attached to a session is one device: the one that started it
(``FIRST_DEVICE``), or one that joined (an id of its own). A resume that names its device
replaces only that device's socket; one that names none takes the whole session over (the
sockets of every other device close with 4009), as before devices existed.

Once a device other than the first has attached, the session is *routed*: each socket gets
the calls of the client functions its device declared (``Connection.functions``), the others
the same ``tool.calls`` event without them (``gateway.shell.effects.for_device``); the calls
of a function no device declared (a client function of the agent's own, which the app
offers on every device) go to every device. The
session's client functions, which the model sees, are those of every device: a device's
declaration (at ``session.attach``, at a resume, in its ``session.update``) replaces its own
and leaves the others'. The first result for a call wins in the core's ledger, as with one
socket; the others are answered ``tool.status`` with ``duplicate``.

A device that closes its socket normally (1000) leaves the session; the session ends when
the last device has left (not when one leaves while the others are between two sockets).
Acknowledgements are per socket: the log is trimmed only up to the lowest ``seq`` every
attached socket acknowledged.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import msgspec

from gateway.core.session import Session
from gateway.shell.connection import Connection
from gateway.shell.effects import Effects
from gateway.shell.session_queue import Device
from gateway.wire.v1 import FIRST_DEVICE, SessionUpdate, ToolSpec

__all__ = ["Devices"]


def _names(specs: Iterable[ToolSpec]) -> frozenset[str]:
    return frozenset(spec.name for spec in specs)


class Devices:
    """The devices of one session, over its ``Effects``' sockets."""

    __slots__ = ("_effects", "_present", "_session")

    def __init__(self, effects: Effects, session: Session) -> None:
        self._effects = effects
        self._session = session
        self._present: set[str] = set()
        """The devices that attached here and have not left (closed with 1000): a device
        between two sockets is still one of the session's."""
        effects.declared = lambda: _names(session.client_functions)

    def replaced_by(self, conn: Connection, device: Device | None) -> list[Connection]:
        """The sockets ``conn`` takes the place of: every other one for a socket taking the
        whole session (``device`` ``None``), the same device's for a resume that names it,
        none for a device joining."""
        others = [c for c in self._effects.conns if c is not conn]
        if device is None:
            return others
        if device.device_id is None:
            return []
        return [c for c in others if c.device == device.device_id]

    def take(
        self, conn: Connection, device: Device | None, replaced: list[Connection], *, acked: int
    ) -> list[ToolSpec] | None:
        """Attach ``conn`` in place of ``replaced`` (closed by the caller).

        Returns:
            The functions its device declares, for ``declare`` (``None``: none declared).
        """
        effects = self._effects
        for old in replaced:
            effects.conns.remove(old)
        conn.acked = acked
        declared = None
        if device is None:
            conn.device, conn.functions = FIRST_DEVICE, None
        else:
            conn.device = device.device_id or self._new_id()
            if conn.device != FIRST_DEVICE and not effects.routed:
                # From now on each call goes to the devices that declared its function; the
                # sockets here so far declared all there are.
                effects.routed = True
                everything = _names(self._session.client_functions)
                for other in effects.conns:
                    if other.functions is None:
                        other.functions = everything
            declared = device.functions
            if declared is None:
                conn.functions = replaced[0].functions if replaced else None
            else:  # its replay, before ``declare``, already holds only its calls
                conn.functions = _names(declared)
        if device is None:  # the whole session: the other devices were closed 4009
            self._present.clear()
        self._present.add(conn.device)
        effects.conns.append(conn)
        return declared

    def left(self, conn: Connection) -> bool:
        """``conn``'s device closed its socket normally (1000): it is done with the
        session. ``True`` when no device is left (the session ends)."""
        self._present.discard(conn.device or "")
        return not self._present

    def declare(
        self, conn: Connection, specs: list[ToolSpec], replaced: list[Connection]
    ) -> SessionUpdate | None:
        """The ``session.update`` that offers ``specs`` as ``conn``'s device's functions
        (in place of those of the sockets it ``replaced``), in a routed session, if it
        changes what the session offers."""
        if not self._effects.routed:
            return None
        before = frozenset().union(*(old.functions or () for old in replaced))
        update, names = self.merged(
            SessionUpdate(client_functions=specs), conn, previous=before | _names(specs)
        )
        merged = update.client_functions or []
        current = self._session.client_functions
        if sorted(merged, key=_name) == sorted(current, key=_name):
            conn.functions = names
            return None
        return update

    def merged(
        self,
        update: SessionUpdate,
        source: Connection,
        *,
        previous: frozenset[str] | None = None,
    ) -> tuple[SessionUpdate, frozenset[str] | None]:
        """``update`` from ``source``'s device as the session applies it: in a routed
        session, its client functions replace that device's (``previous``: ``source``'s
        by default) and join the other devices'; with the names it declares, for ``took``
        (``None``: nothing to route)."""
        specs = update.client_functions
        if specs is None or not self._effects.routed:
            return update, None
        names = _names(specs)
        if previous is None:
            previous = source.functions or frozenset()
        kept = [
            spec
            for spec in self._session.client_functions
            if spec.name not in previous and spec.name not in names
        ]
        return msgspec.structs.replace(update, client_functions=[*kept, *specs]), names

    def took(self, update: SessionUpdate, conn: Connection | None, names: frozenset[str]) -> None:
        """``update`` (from ``merged``) was applied: if the session took it, the calls of
        ``names`` go to ``conn``'s device from now on."""
        if conn is not None and self._session.client_functions is update.client_functions:
            conn.functions = names

    def acked(self, seq: int, source: Connection | None) -> int:
        """``source``'s client acknowledged ``seq``: how far the log may be trimmed now (as
        far as every attached socket has acknowledged)."""
        conns = self._effects.conns
        if source is None or source not in conns:
            return seq if len(conns) < 2 else min(c.acked for c in conns)
        source.acked = max(source.acked, seq)
        return min(c.acked for c in conns)

    def _new_id(self) -> str:
        taken = {c.device for c in self._effects.conns}
        while (device_id := f"dev_{secrets.token_urlsafe(8)}") in taken:
            pass
        return device_id


def _name(spec: ToolSpec) -> str:
    return spec.name

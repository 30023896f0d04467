"""Admission counts: open sockets per client address, sessions in total and per principal.

Pure bookkeeping, no I/O: the transport and the runtime ask before they take a resource and
give it back when it goes. A session counts from ``session.start`` until it ends, so one
waiting for a resume (and the replay log it keeps) stays charged to its principal.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Iterable

from gateway.core.principal import ANONYMOUS
from gateway.errors import TooManySessions

__all__ = ["AddressCounter", "SessionQuota", "proxy_networks"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def proxy_networks(forwarded_allow_ips: str) -> list[_Network]:
    """The explicit addresses and networks of ``forwarded_allow_ips`` (``*`` names none)."""
    networks = []
    for item in forwarded_allow_ips.split(","):
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            continue  # "*", a Unix socket path or a blank: no address to exempt
    return networks


_SEEN_MAX = 4096
"""Addresses whose check is remembered, at most (then forgotten all at once)."""


class AddressCounter:
    """Open sockets per client address, at most ``limit`` each (``None``: no limit).

    Addresses of ``exempt`` networks are not limited: they are the trusted proxies (by
    default this machine, as in ``forwarded_allow_ips``). A proxy's sockets carry each
    client's own address in ``X-Forwarded-For``, which is what gets counted; one that comes
    from the proxy's own address is a local client (a health probe, a benchmark, a tool).
    """

    def __init__(self, limit: int | None, exempt: Iterable[_Network] = ()) -> None:
        self._limit = limit
        self._exempt = tuple(exempt)
        self._open: Counter[str] = Counter()
        self._seen: dict[str, bool] = {}
        """Whether an address is limited, as last worked out (parsing one costs more than
        the rest of a check; a proxy's own address comes with every socket)."""

    def _limited(self, address: str) -> bool:
        limited = self._seen.get(address)
        if limited is None:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                limited = True
            else:
                limited = not any(ip in network for network in self._exempt)
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            self._seen[address] = limited
        return limited

    def acquire(self, address: str) -> bool:
        """Count one more socket from ``address``; ``False`` (and nothing counted) if full."""
        if (
            self._limit is not None
            and self._open[address] >= self._limit
            and self._limited(address)
        ):
            return False
        self._open[address] += 1
        return True

    def release(self, address: str) -> None:
        """A socket from ``address`` is gone."""
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]

    def open(self, address: str) -> int:
        """Sockets open from ``address`` now."""
        return self._open[address]


class SessionQuota:
    """Sessions held in total and by each principal, live or waiting for a resume.

    Args:
        max_total: sessions the gateway holds at most (``None``: no limit).
        max_per_principal: sessions one principal holds at most (``None``: no limit).
        caps: the limits file's ``concurrent_sessions`` a session of a principal with an
            agent counts against, as ``(subject, at most)`` (``Budgets.session_caps``).
    """

    def __init__(
        self,
        *,
        max_total: int | None,
        max_per_principal: int | None,
        caps: Callable[[str, str], list[tuple[str, int]]] | None = None,
    ) -> None:
        self._max_total = max_total
        self._max_per_principal = max_per_principal
        self._caps = caps
        self._held: Counter[str] = Counter()
        self._by_subject: Counter[str] = Counter()
        self.total = 0
        """Sessions held now."""

    def reserve(self, principal: str, agent: str = "") -> None:
        """Count a new session of ``principal`` with ``agent``.

        Raises:
            TooManySessions: 4029 when the principal holds its quota, or its key, end
                user or agent its ``concurrent_sessions``; 1013 when the gateway is full;
                nothing is counted then.
        """
        caps = self._caps(principal, agent) if self._caps is not None else []
        for subject, most in caps:
            if self._by_subject[subject] >= most:
                raise TooManySessions(
                    f"too many sessions: at most {most} for {_whose(subject)}",
                    label="too_many_sessions",
                )
        # Without auth every client is the same anonymous principal: only the total holds.
        if (
            self._max_per_principal is not None
            and principal != ANONYMOUS.name
            and self._held[principal] >= self._max_per_principal
        ):
            raise TooManySessions(
                f"too many sessions: at most {self._max_per_principal} per client",
                label="too_many_sessions",
            )
        if self._max_total is not None and self.total >= self._max_total:
            raise TooManySessions(label="gateway_full")
        self._held[principal] += 1
        self.total += 1
        for subject, _ in caps:
            self._by_subject[subject] += 1

    def release(self, principal: str, agent: str = "") -> None:
        """A session of ``principal`` with ``agent`` ended."""
        self.total -= 1
        self._held[principal] -= 1
        if self._held[principal] <= 0:
            del self._held[principal]
        for subject, _ in self._caps(principal, agent) if self._caps is not None else []:
            self._by_subject[subject] -= 1
            if self._by_subject[subject] <= 0:
                del self._by_subject[subject]

    def held(self, principal: str) -> int:
        """Sessions ``principal`` holds now."""
        return self._held[principal]


def _whose(subject: str) -> str:
    """A limit's subject as a client may read it: not the key's name nor the user's id."""
    if subject.startswith("agent:"):
        return "this agent"
    return "this user" if "/user:" in subject else "this app's key"

"""The rounds of the event loop, counted once for all the sessions of a node.

A session writes a text delta at once when it is the first of this round of the loop (a
paced stream's every delta), and leaves one more in the same round (a burst parsed from one
read) for the round's end, to go with the rest in one write (``Driver._flush_soon``); and a
session's loop hands the event loop over once the sessions' own work in a round passed its
budget (``Driver.run``).
"""

from __future__ import annotations

import asyncio

__all__ = ["ROUNDS", "ROUND_BUDGET", "Rounds"]


ROUND_BUDGET = 0.002
"""Seconds of the sessions' own work in one round of the event loop before a session loop
hands it over (see ``Rounds``): well under the 10 ms a voice stream's beat may slip."""


class Rounds:
    """Counts the rounds of the event loop, lazily: ``current`` schedules one callback per
    round that asks (for all the sessions that ask), which moves the count on at the next.
    A driver whose previous delta went out in an earlier round writes this one at once;
    one more in the same round (a burst parsed from one read) waits for the round's end
    and goes with the rest, in one write.

    Should a loop close with its callback due, the count stays put and every later text
    waits for the end of its round: slower, never out of order.

    ``over_budget`` says when the sessions' own work in this round (from the first that
    asked) passed ``ROUND_BUDGET``: a session loop then hands the event loop over before
    its next event, so that a round stays short and the paced streams' timers, which run
    first in the next, keep their beat. A thousand turns starting (or ending) at once then
    queue up behind each other instead of holding a thousand streams' deltas back.
    """

    __slots__ = ("_due", "_round", "_started")

    def __init__(self) -> None:
        self._round = 0
        self._due = False
        self._started = 0.0

    def current(self, loop: asyncio.AbstractEventLoop) -> int:
        """The number of this round of ``loop``."""
        if not self._due:
            self._due = True
            self._started = loop.time()
            loop.call_soon(self._next)
        return self._round

    def over_budget(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the sessions' work in this round of ``loop`` passed ``ROUND_BUDGET``."""
        if not self._due:
            self.current(loop)
            return False
        return loop.time() - self._started > ROUND_BUDGET

    def _next(self) -> None:
        self._round += 1
        self._due = False


ROUNDS = Rounds()
"""The one count every session of the process reads."""

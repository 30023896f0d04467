"""One timer for many paced callbacks: what a thousand paced streams share.

A paced stream (the scripted model playing its words on a schedule) would otherwise
hold a timer and a task wake-up per word: at 1,000 streams of 20 words/s that is 20,000
timers a second, each with its future and its task switch (a fifth of the gateway's CPU
in the profile of issue 13, docs/performance.md). A ``Pacer`` groups the callbacks due
in the same millisecond under one loop timer and calls them from it directly, no task
and no future in between.

A callback runs at most ``RESOLUTION`` seconds after its time, and may run up to
``RESOLUTION`` before it (its time is rounded to the slot's): a caller that works out
what is due from the clock counts as due what is due by ``now + RESOLUTION``, or it
would be called again and again in the same slot. A callback cannot be withdrawn: its
owner checks at the call whether it still has anything to do.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable

import structlog

__all__ = ["RESOLUTION", "Pacer", "pacer"]

log = structlog.get_logger("gateway.pacer")

RESOLUTION = 0.001
"""Seconds per slot: callbacks due within the same slot run from one timer."""


class Pacer:
    """Runs callbacks at (about) given loop times; see the module docstring."""

    __slots__ = ("_heap", "_loop", "_slots", "_timer", "_timer_slot")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slots: dict[int, list[Callable[[], None]]] = {}
        self._heap: list[int] = []
        """The slots that have callbacks, soonest first."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot = 0

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` at about loop time ``when`` (see the module docstring)."""
        slot = math.ceil(when / RESOLUTION)
        callbacks = self._slots.get(slot)
        if callbacks is not None:
            callbacks.append(callback)
            return
        self._slots[slot] = [callback]
        heapq.heappush(self._heap, slot)
        if self._timer is None or slot < self._timer_slot:
            self._arm(slot)

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        self._timer = self._loop.call_at(slot * RESOLUTION, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now_slot = math.ceil(self._loop.time() / RESOLUTION)
        heap, slots = self._heap, self._slots
        due: list[Callable[[], None]] = []
        # Taken before any is called: one scheduled again for a slot due already runs
        # at the next timer, not in this loop.
        while heap and heap[0] <= now_slot:
            due += slots.pop(heapq.heappop(heap))
        for callback in due:
            try:
                callback()
            except Exception:  # one failing stream must not stop the others'
                log.exception("paced_callback_failed")
        # The callbacks armed the timer for their next turn; slots that came due while they
        # ran are sooner.
        if heap and (self._timer is None or heap[0] < self._timer_slot):
            self._arm(heap[0])


_pacers: dict[asyncio.AbstractEventLoop, Pacer] = {}


def pacer() -> Pacer:
    """The running loop's pacer."""
    loop = asyncio.get_running_loop()
    found = _pacers.get(loop)
    if found is None:
        for old in [old for old in _pacers if old.is_closed()]:
            del _pacers[old]  # the loops of earlier runs (tests start many)
        found = _pacers[loop] = Pacer(loop)
    return found

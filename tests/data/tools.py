"""Server tools of the test agent: each rehearses one way a tool can behave."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec

from gateway.tools.python import Progress, tool

hang_state = {"started": 0, "cancelled": 0}
runs: Counter[str] = Counter()
"""How often each tool really ran (the torture test checks: once per call)."""


class Pair(msgspec.Struct):
    a: int
    b: int


class Sum(msgspec.Struct):
    total: int


@tool()
def add(pair: Pair) -> Sum:
    """Add two integers."""
    runs["add"] += 1
    return Sum(total=pair.a + pair.b)


@tool(timeout=0.3)
async def hang() -> Sum:
    """Never returns; the gateway must time it out and cancel it."""
    hang_state["started"] += 1
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        hang_state["cancelled"] += 1
        raise
    return Sum(total=0)


@tool()
def explode() -> Sum:
    """Always raises."""
    raise ValueError("kaboom")


@tool()
def wrong_shape() -> Sum:
    """Returns something that is not a Sum."""
    return {"total": "not a number"}  # type: ignore[return-value]


# ----------------------------------------------------------------- async tools, gated
# Tests open gates to decide exactly when a tool finishes: no sleeps, no races.
_gates: dict[str, asyncio.Event] = {}


def gate(name: str) -> asyncio.Event:
    """The event called ``name``; tests call ``reset_gates()`` first (events bind a loop)."""
    return _gates.setdefault(name, asyncio.Event())


def reset_gates() -> None:
    _gates.clear()


class OrderQuery(msgspec.Struct):
    order_id: str
    steps: int = 0


class OrderStatus(msgspec.Struct):
    order_id: str
    status: str


async def _lookup(query: OrderQuery, progress: Progress) -> OrderStatus:
    runs[f"lookup:{query.order_id}"] += 1
    for step in range(query.steps):
        progress({"step": step + 1, "of": query.steps})
    try:
        await gate(f"order:{query.order_id}").wait()
    except asyncio.CancelledError:
        gate(f"cancelled:{query.order_id}").set()
        raise
    if query.order_id == "fail":
        raise LookupError("no such order")
    return OrderStatus(order_id=query.order_id, status="shipped")


@tool(execution="async")
async def lookup_order(query: OrderQuery, progress: Progress) -> OrderStatus:
    """Look an order up (async, delivered when idle)."""
    return await _lookup(query, progress)


@tool(execution="async", delivery="interrupt")
async def lookup_order_now(query: OrderQuery, progress: Progress) -> OrderStatus:
    """Look an order up (async, interrupts the running response)."""
    return await _lookup(query, progress)


@tool(execution="async", delivery="silent")
async def lookup_order_quietly(query: OrderQuery, progress: Progress) -> OrderStatus:
    """Look an order up (async, silent: context only)."""
    return await _lookup(query, progress)


@tool(timeout=30)
async def block() -> Sum:
    """A sync tool that runs until the test opens its gate or it is cancelled."""
    try:
        await gate("block").wait()
    except asyncio.CancelledError:
        gate("block_cancelled").set()
        raise
    return Sum(total=1)

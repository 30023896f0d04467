"""Server tools of the test agent: each rehearses one way a tool can behave."""

from __future__ import annotations

import asyncio

import msgspec

from gateway.tools import tool

hang_state = {"started": 0, "cancelled": 0}


class Pair(msgspec.Struct):
    a: int
    b: int


class Sum(msgspec.Struct):
    total: int


@tool()
def add(pair: Pair) -> Sum:
    """Add two integers."""
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

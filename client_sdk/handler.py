"""Running an app's handler (a server-tool handler, a confirmation handler) within a
deadline: the handler may be ``async`` or a plain function, which runs in a worker thread so
that it cannot block the conversation."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["call_handler"]

T = TypeVar("T")


async def call_handler(handler: Callable[[T], Any], arg: T, within: float) -> Any:
    """``handler(arg)``'s value, within ``within`` seconds.

    Raises:
        TimeoutError: the handler overran (a plain function's thread is abandoned).
        Exception: whatever the handler raised.
    """
    async with asyncio.timeout(max(0.0, within)):
        if inspect.iscoroutinefunction(handler):
            return await handler(arg)
        value = await asyncio.to_thread(handler, arg)
        if inspect.isawaitable(value):  # a plain function that returned a coroutine
            value = await value
        return value

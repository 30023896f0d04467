"""Running an app's handler (a server-tool handler, a confirmation handler) within a
deadline: the handler may be ``async`` or a plain function, which runs in a worker thread so
that it cannot block the conversation; and what the gateway hears when one fails
(``failure_text``, also for client functions). The JS SDK's ``describe`` (js/errors.js)
words a failure the same way."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["call_handler", "failure_text"]

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


def failure_text(exc: BaseException) -> str:
    """What the gateway, the model and the user hear of a handler's failure:
    ``"<ClassName>: <message>"`` (``"ValueError: no such zip code"``), or the message alone
    for a bare ``Exception``, whose name says nothing (``raise Exception("the user turned
    off battery access")``); its subclasses keep their name. Without a message, the class
    name alone."""
    message = str(exc)
    if not message:
        return type(exc).__name__
    if type(exc) is Exception:
        return message
    return f"{type(exc).__name__}: {message}"

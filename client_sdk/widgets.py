"""Widget tools: client functions whose result comes from the user, not from code. The
call carries a ``widget`` (a choice, a yes/no question, a short form); the app's handler
shows it and returns the user's answer (``{"choice": ...}``, ``{"confirmed": ...}``, the
form's values), which is the call's result. The JS SDK (``onWidget``) follows the same
rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from client_sdk.handler import call_handler, failure_text
from gateway.wire.v1 import ClientCall, ToolResult

__all__ = ["WidgetHandler", "ask_user"]

WidgetHandler = Callable[[ClientCall], Any]
"""``handler(call)``, async (or a plain function, run in a worker thread): shows
``call.widget`` and returns the user's answer."""

NOT_ANSWERED = "the user did not answer in time"


async def ask_user(handler: WidgetHandler, call: ClientCall) -> ToolResult:
    """The result of widget ``call``: the user's answer, or, when the handler raised or
    overran the call's deadline, an error result saying so."""
    try:
        answer = await call_handler(handler, call, call.timeout)
        return ToolResult(call_id=call.call_id, tool=call.tool, output=msgspec.to_builtins(answer))
    except TimeoutError:
        error = NOT_ANSWERED
    except Exception as exc:  # the user's side failed: the model hears why
        error = failure_text(exc)
    return ToolResult(call_id=call.call_id, tool=call.tool, error=error)

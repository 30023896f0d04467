"""Server tools offered to the client in manual tool mode (``tool.calls`` with ``kind:
server``): the app's handler answers one, or has the gateway run it (``tool.run``).

Without a handler every such call goes back to the gateway to run, so a session in manual
mode behaves as in auto mode. ``client.py`` sends what ``decide`` returns; the JS SDK
(js/server-tools.js, ``onServerTool``) follows the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from client_sdk.handler import call_handler, failure_text
from gateway.wire.v1 import ClientCall, ToolResult, ToolRun

__all__ = ["RUN_ON_GATEWAY", "RunOnGateway", "ServerToolHandler", "decide"]

ServerToolHandler = Callable[[ClientCall], Any]
"""``handler(call)``, async (or a plain function, run in a worker thread): returns the
call's output, raises for an error result, or returns ``RunOnGateway`` to have the gateway
run it."""

OVERRAN = "the server-tool handler overran its deadline"


class RunOnGateway(msgspec.Struct, frozen=True):
    """What a server-tool handler returns to have the gateway run the call (``tool.run``),
    as auto mode would have; the outcome becomes the call's result for the model.

    Args:
        args: the arguments to run it with instead of the model's (the gateway checks them
            against the tool's input schema); the model's when ``None``.
    """

    args: dict[str, Any] | None = None


RUN_ON_GATEWAY = RunOnGateway()
"""Returned by a server-tool handler: run the call on the gateway with the model's arguments."""


async def decide(handler: ServerToolHandler | None, call: ClientCall) -> ToolResult | ToolRun:
    """What to send for the server-kind ``call``: a ``tool.run`` (no handler, or the handler
    returned ``RunOnGateway``), or a result (its output; its exception, or an overrun of the
    call's deadline, as the result's ``error``)."""
    if handler is None:
        return ToolRun(call_id=call.call_id)
    try:
        outcome = await call_handler(handler, call, call.timeout)
        if isinstance(outcome, RunOnGateway):
            args = None if outcome.args is None else dict(outcome.args)
            return ToolRun(call_id=call.call_id, args=args)
        return ToolResult(call_id=call.call_id, tool=call.tool, output=msgspec.to_builtins(outcome))
    except TimeoutError:
        error = OVERRAN
    except Exception as exc:  # the handler's failure is the model's to hear about
        error = failure_text(exc)
    return ToolResult(call_id=call.call_id, tool=call.tool, error=error)

"""Confirmation of tool calls (``tool.confirm``): the app asks the user, the SDK answers.

A tool marked ``confirm`` does not run on the model's guess alone: the gateway asks the
client, and the app's handler (``Conversation.on_confirm``) says whether the user approves
the call (as it is, or with edited arguments) or declines it (the model hears why). Without
a handler every such call is declined: a client that cannot ask the user never approves.
``client.py`` sends what ``ask`` returns; the JS SDK (js/confirm.js, ``onConfirm``)
follows the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from client_sdk.handler import call_handler, failure_text
from gateway.wire.v1 import ConfirmItem, ToolConfirmation

__all__ = [
    "MAX_REASON_CHARS",
    "NO_HANDLER",
    "OVERRAN",
    "Approve",
    "ConfirmHandler",
    "Decline",
    "ask",
    "refused_edit",
]

ConfirmHandler = Callable[[ConfirmItem], Any]
"""``handler(item)``, async (or a plain function, run in a worker thread): returns ``True``
or ``Approve`` to approve the call, ``False`` or ``Decline`` to decline it."""

NO_HANDLER = "this client cannot ask the user"
"""The reason of the decline sent when the app registered no confirmation handler."""
OVERRAN = "the confirmation handler overran its deadline"
MAX_REASON_CHARS = 1000
"""The protocol's limit on a decline's ``reason``; a longer one is cut to fit."""


class Approve(msgspec.Struct, frozen=True):
    """What a confirmation handler returns to approve the call (``True`` is the same as
    ``Approve()``).

    Args:
        args: the arguments to run it with instead of the model's (the gateway checks them
            against the tool's input schema); the model's when ``None``.
    """

    args: dict[str, Any] | None = None


class Decline(msgspec.Struct, frozen=True):
    """What a confirmation handler returns to decline the call (``False`` is the same as
    ``Decline()``); the call fails with ``code: declined``.

    Args:
        reason: why, in the user's words; the model sees it (``no reason given`` when
            ``None``). At most 1000 characters: a longer one is cut.
    """

    reason: str | None = None


async def ask(handler: ConfirmHandler | None, item: ConfirmItem) -> ToolConfirmation:
    """The answer to ``item`` (no ``id`` yet): the handler's decision within the item's
    timeout. No handler, an overrun, an exception or a value that is neither a bool nor
    ``Approve``/``Decline`` declines the call, with a reason that says which."""
    if handler is None:
        return _decline(item, NO_HANDLER)
    try:
        decision = await call_handler(handler, item, item.timeout)
    except TimeoutError:
        return _decline(item, OVERRAN)
    except Exception as exc:  # the handler's failure: never a reason to approve
        return _decline(item, f"the confirmation handler failed ({failure_text(exc)})")
    if decision is True:
        return ToolConfirmation(call_id=item.call_id, approved=True)
    if isinstance(decision, Approve):
        args = None if decision.args is None else msgspec.to_builtins(decision.args)
        return ToolConfirmation(call_id=item.call_id, approved=True, args=args)
    if decision is False:
        return ToolConfirmation(call_id=item.call_id, approved=False)
    if isinstance(decision, Decline):
        return _decline(item, decision.reason)
    return _decline(
        item, f"the confirmation handler returned {type(decision).__name__}, not an answer"
    )


def refused_edit(refused: ToolConfirmation, message: str) -> ToolConfirmation:
    """The decline that answers a call whose approval the gateway refused (edited arguments
    off the tool's schema): the call would otherwise wait until it expires."""
    reason = f"the edited arguments were refused ({message})"
    return ToolConfirmation(call_id=refused.call_id, approved=False, reason=_fit(reason))


def _decline(item: ConfirmItem, reason: str | None) -> ToolConfirmation:
    return ToolConfirmation(call_id=item.call_id, approved=False, reason=_fit(reason))


def _fit(reason: str | None) -> str | None:
    if reason is None or len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 1] + "…"

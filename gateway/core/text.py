"""Text from a model server made safe to send: UTF-16 surrogate halves paired across chunks.

A server written in a UTF-16 language (JavaScript, Java) may cut a stream between the two
halves of a character outside the Basic Multilingual Plane (an emoji): one chunk ends with
``"\\ud83d"`` and the next starts with ``"\\ude00"``. JSON decoding gives Python a string
with a lone surrogate, which no UTF-8 encoder takes, so sending it would fail. A
``SurrogatePairer`` holds a trailing high half back until the next piece of text, joins the
pair into its character, and replaces any half that stays alone with U+FFFD.

Part of the pure core's vocabulary: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.core.model import ModelEvent, ModelFinish, ModelText, ModelToolCall

__all__ = ["SurrogatePairer", "uncarriable", "without_lone_surrogates"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_HIGH = re.compile("[\ud800-\udbff]$")
_REPLACEMENT = "\ufffd"


def without_lone_surrogates(text: str) -> str:
    """``text`` with surrogate pairs joined into their characters and lone halves
    replaced by U+FFFD (unchanged, and not copied, when it has no surrogate)."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _clean(value: Any) -> Any:
    """A JSON value with every string ``without_lone_surrogates``."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, dict):
        return {_clean(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


class SurrogatePairer:
    """Fixes the events of one model step, in order (see the module docstring)."""

    def __init__(self) -> None:
        self.held = ""
        """A high surrogate waiting for its pair (read by the driver's short path: an ASCII
        text with nothing held passes untouched)."""

    def events(self, event: ModelEvent) -> list[ModelEvent]:
        """What to pass on for ``event``: none while a half waits for its pair."""
        if type(event) is ModelText and not self.held and event.text.isascii():
            return [event]  # the usual case, on the path of every delta
        match event:
            case ModelText(text=text):
                text = self.held + text
                self.held = ""
                if _HIGH.search(text):  # its other half may come with the next piece
                    text, self.held = text[:-1], text[-1]
                text = without_lone_surrogates(text)
                return [ModelText(text)] if text else []
            case ModelToolCall(args=args):
                return [
                    *self._flush(),
                    ModelToolCall(
                        name=without_lone_surrogates(event.name),
                        args=_clean(args),
                        args_error=event.args_error,
                    ),
                ]
            case ModelFinish():
                return [*self._flush(), event]
        return [event]  # a retry notice carries no model text

    def _flush(self) -> list[ModelEvent]:
        """A half still held never got its pair: it goes as U+FFFD."""
        if not self.held:
            return []
        self.held = ""
        return [ModelText(_REPLACEMENT)]


def uncarriable(event: ModelEvent) -> str | None:
    """Why the gateway could not carry ``event`` (send it as JSON, store it as
    MessagePack), or ``None``. Only tool calls can fail: their arguments are whatever
    JSON the model wrote, and an integer beyond 64 bits reads in Python but has no
    MessagePack form. Checked before the core sees the event, so a call that could not be
    stored is never made."""
    if not isinstance(event, ModelToolCall):
        return None
    if not isinstance(event.name, str) or not isinstance(event.args, dict):
        return "the model sent a tool call without a name or an arguments object"
    try:
        msgspec.msgpack.encode(event.args)
        msgspec.json.encode(event.args)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        return f"the model sent a tool call the gateway cannot carry ({event.name}: {exc})"
    return None

"""What the core and a model say to each other: the request for one step, the events back.

The session builds a ``ModelRequest`` from its transcript (``gateway.core.transcript``) and
reads the model's answer as ``ModelEvent``s. These are the core's own words: provider
adapters (``gateway.providers``) import them and map them to and from their vendor's
wire format, and nothing here knows a provider exists.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core.transcript import Item

__all__ = [
    "ModelEvent",
    "ModelFinish",
    "ModelRequest",
    "ModelRetrying",
    "ModelText",
    "ModelToolCall",
    "ModelUsage",
    "ToolSchema",
]


class ToolSchema(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as offered to the model."""

    name: str
    description: str
    input_schema: dict[str, Any]


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the model gets for one step."""

    instructions: str
    items: tuple[Item, ...]
    tools: tuple[ToolSchema, ...] = ()
    tool_choice: str = "auto"
    """``auto``, ``none``, ``required`` (at least one call), or the name of the one tool
    to call (one of ``tools``). Providers map it to their own field."""


class ModelText(msgspec.Struct, frozen=True, tag="text"):
    """A piece of the model's text, as generated."""

    text: str


class ModelToolCall(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call"):
    """The model asks for a tool call. ``args`` is a JSON object."""

    name: str
    args: dict[str, Any]
    args_error: str | None = None
    """Set when the model's arguments were not a JSON object: the call fails at once."""


class ModelUsage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    input_audio_tokens: int = 0
    """Of ``input_tokens``, those of audio (a speech-to-speech model's)."""
    output_audio_tokens: int = 0
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those the provider read from its prompt cache."""
    cost: float | None = None
    """What the step cost, in the price table's currency: set by the gateway's meter from
    the model's price (``gateway serve --limits``); ``None``: unknown (no price)."""


class ModelFinish(msgspec.Struct, frozen=True, kw_only=True, tag="finish"):
    """The step is over. ``reason`` is the provider's finish reason, normalised."""

    reason: str = "stop"
    usage: ModelUsage | None = None


class ModelRetrying(msgspec.Struct, frozen=True, kw_only=True, tag="retrying"):
    """The step's request failed before the model said anything and is being sent again.

    A provider yields it only before its first text or call of the step, so the client
    has seen nothing of the step yet; the core tells the client (``response.retrying``).
    """

    attempt: int
    """Which retry this is: 1 for the first."""
    delay: float
    """Seconds the provider waits before sending the request again."""
    reason: str
    """Why, in a few words: ``HTTP 429``, ``ConnectError``, ``no answer in 20 s``..."""


ModelEvent = ModelText | ModelToolCall | ModelFinish | ModelRetrying

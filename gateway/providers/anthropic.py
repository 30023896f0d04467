"""Anthropic Messages API (Claude).

Streams ``/v1/messages`` with ``stream: true``; the typed SSE events run
``message_start``, then per content block ``content_block_start``,
``content_block_delta`` (``text_delta`` or ``input_json_delta``) and
``content_block_stop``, then ``message_delta`` (the stop reason and output
tokens) and ``message_stop``. Tool arguments arrive as JSON text in pieces,
assembled by block ``index``.

Anthropic wants user and assistant messages to alternate, starting with a user
message: consecutive items of one role are merged into one message of several
content blocks (the tool results of a step come first in theirs).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelUsage
from gateway.core.transcript import AssistantTurn, ContextNote, ToolOutcome, UserTurn
from gateway.providers.http import (
    ChunkDecoder,
    HttpProvider,
    SseEvent,
    StreamParser,
    Upstream,
    outcome_json,
    safe_call_id,
    stream_error,
    tool_call,
)

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider", "anthropic_messages"]

ANTHROPIC_VERSION = "2023-06-01"
_DEFAULT_MAX_TOKENS = 1024  # Anthropic requires max_tokens
_OPENING = "(the conversation so far)"
"""The user message put first when the conversation would start with the assistant."""
_STOP_REASONS = {"tool_use": "tool_calls", "end_turn": "stop"}
_TRANSIENT_ERRORS = {"overloaded_error", "api_error", "rate_limit_error"}
"""Mid-stream error types worth sending the request again for."""


def anthropic_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Messages API messages (alternating, starting with a user one)."""
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for item in request.items:
        match item:
            case UserTurn(text=text) | ContextNote(text=text):
                if text:  # Anthropic refuses empty text blocks
                    add("user", {"type": "text", "text": text})
            case AssistantTurn(text=text, calls=calls):
                if text:
                    add("assistant", {"type": "text", "text": text})
                for call in calls:
                    call_id = safe_call_id(call.call_id)
                    use = {"type": "tool_use", "id": call_id, "name": call.name, "input": call.args}
                    add("assistant", use)
            case ToolOutcome(call_id=call_id, output=output, error=error):
                result: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": safe_call_id(call_id),
                    "content": outcome_json(output, error),
                }
                if error is not None:
                    result["is_error"] = True
                add("user", result)
    for message in messages:
        if message["role"] == "user":  # tool results must lead their message
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    if messages and messages[0]["role"] == "assistant":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": _OPENING}]})
    return messages


class AnthropicProvider(HttpProvider):
    """A ``Provider`` for Anthropic's Messages API."""

    name = "anthropic"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "max_tokens": self.settings.max_tokens or _DEFAULT_MAX_TOKENS,
            "messages": anthropic_messages(request),
            "stream": True,
        }
        if request.instructions:
            body["system"] = request.instructions
        if request.tools:
            body["tools"] = [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                }
                for tool in request.tools
            ]
            if request.tool_choice != "auto":  # absent means auto: its bodies stay as they were
                body["tool_choice"] = _tool_choice(request.tool_choice)
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        return body

    def upstream(self, request: ModelRequest) -> Upstream:
        headers = {"anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        if self.settings.api_key:
            headers["x-api-key"] = self.settings.api_key
        url = self.settings.base_url.rstrip("/") + "/v1/messages"
        return Upstream(url, self.body(request), headers)

    def parser(self) -> StreamParser:
        return _Stream()


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    """Not counting the prompt cache's tokens (Anthropic counts those apart)."""
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Message(msgspec.Struct):
    usage: _Usage | None = None


class _Block(msgspec.Struct):
    type: str | None = None
    text: str | None = None
    name: str | None = None


class _Delta(msgspec.Struct):
    """A ``content_block_delta``'s (text or JSON) or a ``message_delta``'s (the stop)."""

    type: str | None = None
    text: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class _Event(msgspec.Struct):
    """One event's data: only what is read of it."""

    type: str | None = None
    index: int | None = None
    message: _Message | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: Any = None


_event = ChunkDecoder(_Event)


class _Stream:
    """One answer's events: text as it comes, tool calls assembled by block ``index``,
    the finish at ``message_stop`` or the end of the body."""

    __slots__ = ("_cache_written", "_cached", "_calls", "_input", "_output", "_stop", "over")

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}
        self._stop: str | None = None
        self._input = self._output = self._cached = self._cache_written = 0
        self.over = False

    def feed(self, events: list[SseEvent]) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for event in events:
            data = _event(event.data)
            kind = event.event if event.event != "message" else data.type
            if kind == "content_block_delta":  # most events: first
                delta = data.delta
                if delta is None:
                    continue
                if delta.type == "text_delta" and delta.text:
                    out.append(ModelText(delta.text))
                elif delta.type == "input_json_delta":
                    call = self._calls.setdefault(data.index or 0, ["", ""])
                    call[1] += delta.partial_json or ""
            elif kind == "message_start":
                self._count(data.message.usage if data.message is not None else None)
            elif kind == "content_block_start":
                block = data.content_block
                if block is None:
                    continue
                if block.type == "tool_use":
                    self._calls[data.index or 0] = [block.name or "", ""]
                elif block.type == "text" and block.text:
                    out.append(ModelText(block.text))
            elif kind == "message_delta":
                if data.delta is not None:
                    self._stop = data.delta.stop_reason or self._stop
                self._count(data.usage)
            elif kind == "message_stop":
                self.over = True
                break
            elif kind == "error":
                error = data.error
                message = error.get("message") if isinstance(error, dict) else error
                kind = error.get("type") if isinstance(error, dict) else None
                raise stream_error(
                    f"sent an error: {message or 'unknown error'}",
                    retryable=kind in _TRANSIENT_ERRORS,
                )
        return out

    def _count(self, usage: _Usage | None) -> None:
        if usage is not None:
            self._input = usage.input_tokens or self._input
            self._output = usage.output_tokens or self._output
            self._cached = usage.cache_read_input_tokens or self._cached
            self._cache_written = usage.cache_creation_input_tokens or self._cache_written

    def end(self) -> list[ModelEvent]:
        if self._stop is None:
            raise stream_error("ended the stream without a stop reason (truncated)", retryable=True)
        out: list[ModelEvent] = [tool_call(*self._calls[index]) for index in sorted(self._calls)]
        out.append(
            ModelFinish(
                reason=_STOP_REASONS.get(self._stop, self._stop),
                # The gateway's input_tokens count every input token, the cache's too.
                usage=ModelUsage(
                    input_tokens=self._input + self._cached + self._cache_written,
                    output_tokens=self._output,
                    cached_input_tokens=self._cached,
                ),
            )
        )
        return out


def _tool_choice(choice: str) -> dict[str, Any]:
    """``ModelRequest.tool_choice`` (not ``auto``) as the Messages API's ``tool_choice``:
    Anthropic says ``any`` for "at least one call" and ``tool`` for one named tool."""
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}

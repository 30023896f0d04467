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

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelUsage
from gateway.core.transcript import AssistantTurn, ContextNote, ToolOutcome, UserTurn
from gateway.providers.http import (
    HttpProvider,
    SseEvent,
    Upstream,
    json_object,
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

    async def parse(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[ModelEvent, None]:
        calls: dict[int, dict[str, str]] = {}
        stop: str | None = None
        input_tokens = output_tokens = 0
        async for event in events:
            data = json_object(event.data)
            kind = event.event if event.event != "message" else data.get("type")
            if kind == "message_start":
                usage = (data.get("message") or {}).get("usage") or {}
                input_tokens = usage.get("input_tokens") or input_tokens
                output_tokens = usage.get("output_tokens") or output_tokens
            elif kind == "content_block_start":
                block = data.get("content_block") or {}
                if block.get("type") == "tool_use":
                    calls[data.get("index", 0)] = {"name": block.get("name") or "", "arguments": ""}
                elif block.get("type") == "text" and block.get("text"):
                    yield ModelText(block["text"])
            elif kind == "content_block_delta":
                delta = data.get("delta") or {}
                if delta.get("type") == "text_delta" and delta.get("text"):
                    yield ModelText(delta["text"])
                elif delta.get("type") == "input_json_delta":
                    call = calls.setdefault(data.get("index", 0), {"name": "", "arguments": ""})
                    call["arguments"] += delta.get("partial_json") or ""
            elif kind == "message_delta":
                stop = (data.get("delta") or {}).get("stop_reason") or stop
                usage = data.get("usage") or {}
                input_tokens = usage.get("input_tokens") or input_tokens
                output_tokens = usage.get("output_tokens") or output_tokens
            elif kind == "message_stop":
                break
            elif kind == "error":
                error = data.get("error") or {}
                message = error.get("message") if isinstance(error, dict) else error
                kind = error.get("type") if isinstance(error, dict) else None
                raise stream_error(
                    f"sent an error: {message or 'unknown error'}",
                    retryable=kind in _TRANSIENT_ERRORS,
                )
        if stop is None:
            raise stream_error("ended the stream without a stop reason (truncated)", retryable=True)
        for index in sorted(calls):
            yield tool_call(calls[index]["name"], calls[index]["arguments"])
        yield ModelFinish(
            reason=_STOP_REASONS.get(stop, stop),
            usage=ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens),
        )


def _tool_choice(choice: str) -> dict[str, Any]:
    """``ModelRequest.tool_choice`` (not ``auto``) as the Messages API's ``tool_choice``:
    Anthropic says ``any`` for "at least one call" and ``tool`` for one named tool."""
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}

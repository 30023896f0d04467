"""OpenAI-compatible Chat Completions: OpenAI, vLLM, Ollama, llama.cpp, LM Studio...

Streams ``/chat/completions`` with ``stream: true``; text comes in
``choices[0].delta.content``, tool calls in ``delta.tool_calls`` fragments that
are assembled by ``index`` (name first, arguments as JSON text in pieces).
"""

from __future__ import annotations

import json
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

__all__ = ["OpenAIProvider", "openai_messages"]


def openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for item in request.items:
        match item:
            case UserTurn(text=text) | ContextNote(text=text):
                messages.append({"role": "user", "content": text})
            case AssistantTurn(text="", calls=()):
                pass  # a step that said nothing: see docs/providers.md, "History"
            case AssistantTurn(text=text, calls=calls):
                message: dict[str, Any] = {"role": "assistant", "content": text or None}
                if calls:
                    message["tool_calls"] = [
                        {
                            "id": safe_call_id(call.call_id),
                            "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.args)},
                        }
                        for call in calls
                    ]
                messages.append(message)
            case ToolOutcome(call_id=call_id, output=output, error=error):
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": safe_call_id(call_id),
                        "content": outcome_json(output, error),
                    }
                )
    return messages


class OpenAIProvider(HttpProvider):
    """A ``Provider`` for any OpenAI-compatible Chat Completions server."""

    name = "openai"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": openai_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.input_schema,
                    },
                }
                for tool in request.tools
            ]
            if request.tool_choice != "auto":  # absent means auto: its bodies stay as they were
                body["tool_choice"] = _tool_choice(request.tool_choice)
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        return body

    def upstream(self, request: ModelRequest) -> Upstream:
        headers = (
            {"authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        )
        url = self.settings.base_url.rstrip("/") + "/chat/completions"
        return Upstream(url, self.body(request), headers)

    async def parse(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[ModelEvent, None]:
        calls: dict[int, dict[str, str]] = {}
        finish: str | None = None
        usage: ModelUsage | None = None
        async for event in events:
            if event.data == "[DONE]":
                break
            chunk = json_object(event.data)
            if chunk.get("error"):  # some compatible servers report failures in the stream
                raise stream_error(f"sent an error: {_message(chunk['error'])}", retryable=True)
            if chunk.get("usage"):
                usage = ModelUsage(
                    input_tokens=chunk["usage"].get("prompt_tokens", 0),
                    output_tokens=chunk["usage"].get("completion_tokens", 0),
                )
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    yield ModelText(delta["content"])
                for fragment in delta.get("tool_calls") or []:
                    call = calls.setdefault(fragment.get("index", 0), {"name": "", "arguments": ""})
                    function = fragment.get("function") or {}
                    call["name"] += function.get("name") or ""
                    call["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        if finish is None:
            raise stream_error(
                "ended the stream without a finish reason (truncated)", retryable=True
            )
        for index in sorted(calls):
            yield tool_call(calls[index]["name"], calls[index]["arguments"])
        yield ModelFinish(reason=finish, usage=usage)


def _tool_choice(choice: str) -> str | dict[str, Any]:
    """``ModelRequest.tool_choice`` (not ``auto``) as Chat Completions' ``tool_choice``."""
    if choice in ("none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _message(error: Any) -> str:
    return str(error.get("message", error) if isinstance(error, dict) else error)

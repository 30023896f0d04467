"""OpenAI-compatible Chat Completions: OpenAI, vLLM, Ollama, llama.cpp, LM Studio...

Streams ``/chat/completions`` with ``stream: true``; text comes in
``choices[0].delta.content``, tool calls in ``delta.tool_calls`` fragments that
are assembled by ``index`` (name first, arguments as JSON text in pieces).
"""

from __future__ import annotations

import json
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

    def parser(self) -> StreamParser:
        return _Stream()


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _Fragment(msgspec.Struct):
    index: int | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_Fragment] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Chunk(msgspec.Struct):
    """A ``chat.completion.chunk``: only what is read of it."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


_chunk = ChunkDecoder(_Chunk)


class _Stream:
    """One answer's chunks: text as it comes, tool calls assembled from their fragments by
    ``index`` (the name first, the arguments' JSON text in pieces), the finish at ``[DONE]``
    or the end of the body."""

    __slots__ = ("_calls", "_finish", "_usage", "over")

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}
        self._finish: str | None = None
        self._usage: ModelUsage | None = None
        self.over = False

    def feed(self, events: list[SseEvent]) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for event in events:
            if event.data == b"[DONE]":
                self.over = True
                break
            chunk = _chunk(event.data)
            if chunk.error:  # some compatible servers report failures in the stream
                raise stream_error(f"sent an error: {_message(chunk.error)}", retryable=True)
            usage = chunk.usage
            if usage is not None:
                details = usage.prompt_tokens_details
                self._usage = ModelUsage(
                    input_tokens=usage.prompt_tokens or 0,
                    output_tokens=usage.completion_tokens or 0,
                    cached_input_tokens=(details.cached_tokens or 0) if details else 0,
                )
            for choice in chunk.choices or ():
                delta = choice.delta
                if delta is not None:
                    if delta.content:
                        out.append(ModelText(delta.content))
                    for fragment in delta.tool_calls or ():
                        call = self._calls.setdefault(fragment.index or 0, ["", ""])
                        function = fragment.function
                        if function is not None:
                            call[0] += function.name or ""
                            call[1] += function.arguments or ""
                self._finish = choice.finish_reason or self._finish
        return out

    def end(self) -> list[ModelEvent]:
        if self._finish is None:
            raise stream_error(
                "ended the stream without a finish reason (truncated)", retryable=True
            )
        out: list[ModelEvent] = [tool_call(*self._calls[index]) for index in sorted(self._calls)]
        out.append(ModelFinish(reason=self._finish, usage=self._usage))
        return out


def _tool_choice(choice: str) -> str | dict[str, Any]:
    """``ModelRequest.tool_choice`` (not ``auto``) as Chat Completions' ``tool_choice``."""
    if choice in ("none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _message(error: Any) -> str:
    return str(error.get("message", error) if isinstance(error, dict) else error)

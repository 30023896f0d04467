"""Google Gemini: ``models/{model}:streamGenerateContent`` with ``alt=sse``.

Each SSE event is a whole ``GenerateContentResponse``: text comes in
``candidates[0].content.parts[].text``, function calls whole (never in
fragments) in ``parts[].functionCall``; the last chunk carries
``finishReason`` and ``usageMetadata``. The conversation goes as ``contents``
with roles ``user`` and ``model``; tool outcomes are ``functionResponse`` parts
of a user content.
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
    safe_call_id,
    stream_error,
    tool_call,
)

__all__ = ["GeminiProvider", "gemini_contents"]


def _response(output: Any, error: str | None) -> dict[str, Any]:
    """A tool outcome as a ``functionResponse.response`` (which must be a JSON object)."""
    if error is not None:
        return {"error": error}
    if isinstance(output, dict):
        return output
    return {"result": output}


def _calling(choice: str) -> dict[str, Any]:
    """``ModelRequest.tool_choice`` (not ``auto``) as a ``functionCallingConfig``. Gemini has
    no mode for one tool: ``ANY`` (some call) narrowed to that one name does it."""
    if choice == "none":
        return {"mode": "NONE"}
    if choice == "required":
        return {"mode": "ANY"}
    return {"mode": "ANY", "allowedFunctionNames": [choice]}


def gemini_contents(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Gemini ``contents``, consecutive same-role items merged."""
    contents: list[dict[str, Any]] = []

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})

    for item in request.items:
        match item:
            case UserTurn(text=text) | ContextNote(text=text):
                add("user", [{"text": text}] if text else [])  # Gemini refuses empty text
            case AssistantTurn(text=text, calls=calls):
                parts: list[dict[str, Any]] = [{"text": text}] if text else []
                parts.extend(
                    {
                        "functionCall": {
                            "name": call.name,
                            "args": call.args,
                            "id": safe_call_id(call.call_id),
                        }
                    }
                    for call in calls
                )
                add("model", parts)
            case ToolOutcome(call_id=call_id, name=name, output=output, error=error):
                response = {
                    "name": name,
                    "id": safe_call_id(call_id),
                    "response": _response(output, error),
                }
                add("user", [{"functionResponse": response}])
    return contents


class GeminiProvider(HttpProvider):
    """A ``Provider`` for the Gemini API (Google AI Studio's ``v1beta``)."""

    name = "gemini"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"contents": gemini_contents(request)}
        if request.instructions:
            body["systemInstruction"] = {"parts": [{"text": request.instructions}]}
        if request.tools:
            body["tools"] = [
                {
                    "functionDeclarations": [
                        {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.input_schema,
                        }
                        for tool in request.tools
                    ]
                }
            ]
            if request.tool_choice != "auto":  # absent means AUTO: its bodies stay as they were
                body["toolConfig"] = {"functionCallingConfig": _calling(request.tool_choice)}
        config: dict[str, Any] = {}
        if self.settings.temperature is not None:
            config["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            config["maxOutputTokens"] = self.settings.max_tokens
        if config:
            body["generationConfig"] = config
        return body

    def upstream(self, request: ModelRequest) -> Upstream:
        headers = {"x-goog-api-key": self.settings.api_key} if self.settings.api_key else {}
        url = (
            self.settings.base_url.rstrip("/")
            + f"/v1beta/models/{self.settings.model}:streamGenerateContent?alt=sse"
        )
        return Upstream(url, self.body(request), headers)

    def parser(self) -> StreamParser:
        return _Stream()


class _FunctionCall(msgspec.Struct):
    name: str | None = None
    args: Any = None


class _Part(msgspec.Struct, rename="camel"):
    text: str | None = None
    thought: bool | None = None
    function_call: _FunctionCall | None = None


class _Content(msgspec.Struct):
    parts: list[_Part] | None = None


class _Candidate(msgspec.Struct, rename="camel"):
    content: _Content | None = None
    finish_reason: str | None = None


class _UsageMetadata(msgspec.Struct, rename="camel"):
    prompt_token_count: int | None = None
    candidates_token_count: int | None = None
    cached_content_token_count: int | None = None


class _PromptFeedback(msgspec.Struct, rename="camel"):
    block_reason: str | None = None


class _Chunk(msgspec.Struct, rename="camel"):
    """A ``GenerateContentResponse``: only what is read of it."""

    candidates: list[_Candidate] | None = None
    usage_metadata: _UsageMetadata | None = None
    prompt_feedback: _PromptFeedback | None = None
    error: Any = None


_chunk = ChunkDecoder(_Chunk)


class _Stream:
    """One answer's chunks: text as it comes, function calls whole, the finish with the
    chunk that has a finish reason (the last) or at the end of the body."""

    __slots__ = ("_calls", "_finish", "_usage", "over")

    def __init__(self) -> None:
        self._calls: list[tuple[str, Any]] = []
        self._finish: str | None = None
        self._usage: ModelUsage | None = None
        self.over = False

    def feed(self, events: list[SseEvent]) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for event in events:
            chunk = _chunk(event.data)
            if chunk.error:
                error = chunk.error
                message = error.get("message", error) if isinstance(error, dict) else error
                raise stream_error(f"sent an error: {message}", retryable=True)
            usage = chunk.usage_metadata
            if usage is not None:
                self._usage = ModelUsage(
                    input_tokens=usage.prompt_token_count or 0,
                    output_tokens=usage.candidates_token_count or 0,
                    cached_input_tokens=usage.cached_content_token_count or 0,
                )
            feedback = chunk.prompt_feedback
            if feedback is not None and feedback.block_reason:
                self._finish = feedback.block_reason  # the prompt was refused: no candidates
            if chunk.candidates:
                candidate = chunk.candidates[0]
                content = candidate.content
                for part in (content.parts if content is not None else None) or ():
                    if part.text and not part.thought:
                        out.append(ModelText(part.text))
                    if part.function_call is not None:
                        function = part.function_call
                        self._calls.append((function.name or "", function.args))
                self._finish = candidate.finish_reason or self._finish
            if self._finish:  # the last chunk: stop reading, as openai.py does at [DONE]
                self.over = True
                break
        return out

    def end(self) -> list[ModelEvent]:
        if self._finish is None:
            raise stream_error(
                "ended the stream without a finish reason (truncated)", retryable=True
            )
        out: list[ModelEvent] = [
            tool_call(name, json.dumps({} if args is None else args)) for name, args in self._calls
        ]
        reason = "tool_calls" if self._calls else self._finish.lower()
        out.append(ModelFinish(reason=reason, usage=self._usage))
        return out

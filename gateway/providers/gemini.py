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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway.core.model import ModelEvent, ModelFinish, ModelRequest, ModelText, ModelUsage
from gateway.core.transcript import AssistantTurn, ContextNote, ToolOutcome, UserTurn
from gateway.providers.http import (
    HttpProvider,
    SseEvent,
    Upstream,
    json_object,
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

    async def parse(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[ModelEvent, None]:
        calls: list[tuple[str, Any]] = []
        finish: str | None = None
        usage: ModelUsage | None = None
        async for event in events:
            chunk = json_object(event.data)
            if chunk.get("error"):
                error = chunk["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                raise stream_error(f"sent an error: {message}", retryable=True)
            if chunk.get("usageMetadata"):
                usage = ModelUsage(
                    input_tokens=chunk["usageMetadata"].get("promptTokenCount", 0),
                    output_tokens=chunk["usageMetadata"].get("candidatesTokenCount", 0),
                )
            block = (chunk.get("promptFeedback") or {}).get("blockReason")
            if block:  # the prompt itself was refused: no candidates follow
                finish = block
            candidates = chunk.get("candidates") or [{}]
            candidate = candidates[0]
            for part in (candidate.get("content") or {}).get("parts") or []:
                if part.get("text") and not part.get("thought"):
                    yield ModelText(part["text"])
                if part.get("functionCall"):
                    function = part["functionCall"]
                    calls.append((function.get("name") or "", function.get("args")))
            finish = candidate.get("finishReason") or finish
            if finish:  # the last chunk: stop reading, as openai.py does at [DONE]
                break
        if finish is None:
            raise stream_error(
                "ended the stream without a finish reason (truncated)", retryable=True
            )
        for name, args in calls:
            yield tool_call(name, json.dumps({} if args is None else args))
        reason = "tool_calls" if calls else finish.lower()
        yield ModelFinish(reason=reason, usage=usage)

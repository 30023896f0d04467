"""One call of an OpenAPI operation over HTTP: the request its arguments make, and its result.

``backend`` plans each operation (an ``Operation``) when it loads the document;
here a call's arguments become the path, query, headers and body OpenAPI's parameter styles
ask for, and the answer becomes the tool's result (JSON, text or ``None``) or a ``ToolError``.
"""

from __future__ import annotations

import http
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from gateway.errors import ToolError
from gateway.tools.openapi.document import PATH_TEMPLATE, is_json

__all__ = [
    "MAX_ANSWER_SIZE",
    "Operation",
    "Param",
    "answer",
    "build_request",
    "read_body",
    "status_line",
]

MAX_ANSWER_SIZE = 8 * 2**20
"""Bytes of an answer a call reads; a larger one is a ``ToolError``."""
_MAX_EXCERPT = 500


@dataclass(frozen=True, slots=True)
class Param:
    """A parameter of an operation: where its value goes, and how it is written."""

    name: str
    """As the API knows it."""
    location: str
    prop: str
    """The input schema's property holding its value."""
    style: str
    explode: bool
    as_json: bool
    """Declared with ``content`` rather than ``schema``: the value is sent as JSON text."""


@dataclass(frozen=True, slots=True)
class Operation:
    """What calling an operation takes."""

    method: str
    path: str
    params: tuple[Param, ...]
    body_type: str | None
    """The JSON media type of the request body (property ``body``), or ``None``."""


def build_request(
    operation: Operation, args: Mapping[str, Any]
) -> tuple[str, list[tuple[str, str]], dict[str, str], bytes | None]:
    """The path, query, headers and body of a call with ``args``.

    Raises:
        ToolError: a path parameter is missing, or a header value is not ASCII.
    """
    in_path: dict[str, str] = {}
    query: list[tuple[str, str]] = []
    headers: dict[str, str] = {}
    for param in operation.params:
        value = args.get(param.prop)
        if value is None:  # left out, or null: not sent
            continue
        if param.as_json:
            value = msgspec.json.encode(value).decode()
        if param.location == "path":
            in_path[param.name] = _simple(value, param.explode, lambda t: quote(t, safe=""))
        elif param.location == "query":
            query += _query(param, value)
        else:
            text = _simple(value, param.explode, lambda t: t)
            if not text.isascii():
                raise ToolError(f"header {param.name}: only ASCII text can be sent")
            headers[param.name] = text

    def fill(match: re.Match[str]) -> str:
        if match.group(1) not in in_path:
            raise ToolError(f"path parameter {match.group(1)!r} is missing")
        return in_path[match.group(1)]

    path = PATH_TEMPLATE.sub(fill, operation.path)
    content = None
    if operation.body_type is not None and "body" in args:
        content = msgspec.json.encode(args["body"])
        headers["Content-Type"] = operation.body_type
    return path, query, headers, content


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def _simple(value: Any, explode: bool, encode: Callable[[str], str]) -> str:
    """OpenAPI's ``simple`` style (path and header parameters): ``a,b``, ``k,v`` or ``k=v``."""
    if isinstance(value, list):
        return ",".join(encode(_text(item)) for item in value)
    if isinstance(value, dict):
        pairs = [(encode(str(k)), encode(_text(v))) for k, v in value.items()]
        return ",".join(f"{k}={v}" if explode else f"{k},{v}" for k, v in pairs)
    return encode(_text(value))


def _query(param: Param, value: Any) -> list[tuple[str, str]]:
    """OpenAPI's query styles: ``form`` (arrays repeated by default), ``deepObject``..."""
    if isinstance(value, list):
        if param.explode:
            return [(param.name, _text(item)) for item in value]
        joiner = {"spaceDelimited": " ", "pipeDelimited": "|"}.get(param.style, ",")
        return [(param.name, joiner.join(_text(item) for item in value))]
    if isinstance(value, dict):
        if param.style == "deepObject":
            return [(f"{param.name}[{k}]", _text(v)) for k, v in value.items()]
        if param.explode:
            return [(str(k), _text(v)) for k, v in value.items()]
        return [(param.name, ",".join(f"{k},{_text(v)}" for k, v in value.items()))]
    return [(param.name, _text(value))]


async def read_body(response: httpx.Response, limit: int) -> bytes | None:
    """The body, or ``None`` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def answer(response: httpx.Response, raw: bytes | None) -> Any:
    """The result of a call: JSON, text or ``None``.

    Args:
        response: the answer (its status and headers).
        raw: its body, as ``read_body`` with ``MAX_ANSWER_SIZE`` returned it.

    Raises:
        ToolError: the status is not 2xx, or the answer is too large.
    """
    if raw is None:
        raise ToolError(
            f"HTTP {response.status_code}: the answer is larger than {MAX_ANSWER_SIZE // 2**20} MiB"
        )
    if not response.is_success:
        raise ToolError(status_line(response, raw))
    if response.status_code == 204 or not raw.strip():
        return None
    if is_json(response.headers.get("content-type", "")):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            pass  # it says JSON but is not: the model gets the text
    return _decode(response, raw)


def status_line(response: httpx.Response, raw: bytes) -> str:
    """``HTTP 404 Not Found: {"error": ...}``, the answer's whitespace collapsed, cut short."""
    status = response.status_code
    reason = response.reason_phrase
    if not reason:
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = ""
    line = f"HTTP {status} {reason}".rstrip()
    excerpt = " ".join(_decode(response, raw).split())
    if len(excerpt) > _MAX_EXCERPT:
        excerpt = excerpt[: _MAX_EXCERPT - 1] + "…"
    return f"{line}: {excerpt}" if excerpt else line


def _decode(response: httpx.Response, raw: bytes) -> str:
    try:
        return raw.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return raw.decode("utf-8", errors="replace")

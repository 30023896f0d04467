"""What an MCP server's answers mean to the gateway, for ``gateway.tools.mcp.backend``.

The tools it lists become ``ToolDef``s (chosen and adjusted by the agent file; a tool the
gateway cannot offer is left out with a warning), a call's result becomes what the model
sees or a ``ToolError``, a progress notification becomes the payload the gateway reports,
and a failed connection attempt becomes a sentence for the agent's author. Nothing here
awaits or touches the connection.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx2
import mcp_types as types
import structlog
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.core.tool import ToolDef, check_tool, default_display_name
from gateway.errors import ConfigError, ToolError
from gateway.tools.base import tool_name
from gateway.tools.entry import McpServerEntry, check_options_known, with_options

__all__ = ["definitions_of", "describe_failure", "leaf_of", "progress_payload", "tool_result"]

log = structlog.get_logger("gateway.tools")

_CANCELLED = asyncio.CancelledError  # what anyio cancels with, on asyncio


def definitions_of(
    listed: list[types.Tool], entry: McpServerEntry, backend: str
) -> tuple[tuple[ToolDef, ...], dict[str, str], str | None]:
    """Our definitions of the server's tools, our names to theirs, and what does not
    match the agent file (``tools``, ``tool_options``), if anything.

    Args:
        listed: the server's tools, as it lists them.
        entry: the server's settings from the agent file.
        backend: the backend's name (``mcp:<server>``), which its errors start with.

    Returns:
        The definitions, the server's own name of each tool by ours, and the mismatch
        (``None`` when there is none).
    """
    offered = {t.name: t for t in listed}
    problem = None
    selected = listed
    if entry.tools is not None:
        missing = [n for n in entry.tools if n not in offered]
        if missing:
            problem = (
                f"tools names {', '.join(map(repr, missing))}, which it does not offer"
                f" (it offers: {', '.join(sorted(offered)) or 'nothing'})"
            )
        selected = [offered[n] for n in entry.tools if n in offered]
    try:
        check_options_known(backend, entry.tool_options, [t.name for t in selected])
    except ConfigError as exc:
        problem = problem or str(exc).removeprefix(f"{backend}: ")
    definitions: list[ToolDef] = []
    originals: dict[str, str] = {}
    for tool in selected:
        definition = _definition(tool, entry)
        if definition is None:
            continue
        if definition.name in originals:
            log.warning(
                "mcp_tool_left_out",
                server=entry.name,
                tool=tool.name,
                reason=f"{tool.name!r} and {originals[definition.name]!r} are both"
                f" {definition.name!r} here",
            )
            continue
        definitions.append(definition)
        originals[definition.name] = tool.name
    return tuple(definitions), originals, problem


def _definition(tool: types.Tool, entry: McpServerEntry) -> ToolDef | None:
    """The ``ToolDef`` of an MCP tool, or ``None`` (with a warning) when it is unusable."""
    name = tool_name(tool.name)
    annotations = tool.annotations
    title = tool.title or (annotations.title if annotations else None)
    description = (tool.description or "").strip() or (title or "").strip()
    schema = dict(tool.input_schema)
    schema.setdefault("type", "object")
    definition = ToolDef(
        name=name,
        description=description or f"The {tool.name!r} tool of the MCP server {entry.name!r}.",
        kind="server",
        input_schema=schema,
        output_schema=tool.output_schema,
        display_name=title or default_display_name(name),
        timeout=entry.timeout,
        read_only=annotations.read_only_hint if annotations else None,
    )
    definition = with_options(definition, entry.tool_options.get(tool.name))
    try:
        check_tool(definition)
    except ConfigError as exc:
        log.warning("mcp_tool_left_out", server=entry.name, tool=tool.name, reason=str(exc))
        return None
    return definition


def progress_payload(progress: float, total: float | None, message: str | None) -> dict[str, Any]:
    """A progress notification of a call, as the gateway reports it (``ReportProgress``)."""
    payload: dict[str, Any] = {"progress": _number(progress)}
    if total is not None:
        payload["total"] = _number(total)
    if message is not None:
        payload["message"] = message
    return payload


def _number(value: float) -> float | int:
    """``3`` rather than ``3.0``: the SDK makes every progress value a float."""
    return int(value) if value.is_integer() else value


def leaf_of(exc: BaseException) -> BaseException:
    """The first exception in a (nested) group that is not a cancellation."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [leaf_of(e) for e in exc.exceptions]
        useful = [e for e in leaves if not isinstance(e, _CANCELLED)]
        return (useful or leaves or [exc])[0]
    return exc


def _os_reason(exc: BaseException) -> str | None:
    """``connection refused`` and the like, from the innermost ``OSError`` with an errno."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return os.strerror(current.errno).lower()
        current = current.__cause__ or current.__context__
    return None


def describe_failure(exc: BaseException, entry: McpServerEntry) -> str:
    """Why a connection attempt failed, for the agent's author.

    Args:
        exc: what the attempt raised, perhaps a (nested) exception group.
        entry: the server's settings from the agent file.
    """
    leaf = leaf_of(exc)
    target = entry.url or " ".join(entry.command)
    if isinstance(leaf, FileNotFoundError) and entry.command:
        if leaf.filename is not None and str(leaf.filename) != entry.command[0]:
            return f"cannot start {target!r}: no such directory {leaf.filename}"
        return f"command not found: {entry.command[0]}"
    if isinstance(leaf, OSError) and entry.command:
        return f"cannot start {target!r}: {leaf.strerror or leaf}"
    if isinstance(leaf, httpx2.TimeoutException):
        return f"{target} did not answer in time"
    if isinstance(leaf, httpx2.TransportError):
        return f"cannot connect to {target}: {_os_reason(leaf) or leaf}"
    if isinstance(leaf, MCPError) and leaf.code == types.CONNECTION_CLOSED and entry.command:
        return f"{target!r} exited or closed its output before it answered (see its stderr)"
    if isinstance(leaf, MCPError):
        return f"{target} answered with MCP error {leaf.code}: {leaf.message}"
    if isinstance(leaf, ValidationError):
        return f"{target} sent an invalid answer: {leaf.error_count()} problem(s)"
    return f"{target}: {type(leaf).__name__}: {leaf}"


def _decoded_size(data: str) -> int:
    """Bytes in base64 ``data``, without decoding it."""
    return len(data) * 3 // 4 - len(data[-2:]) + len(data[-2:].rstrip("="))


def _block(block: types.ContentBlock) -> dict[str, Any]:
    """One content item as JSON: media are described, their bytes left out."""
    described: dict[str, Any]
    match block:
        case types.TextContent(text=text):
            described = {"type": "text", "text": text}
        case (
            types.ImageContent(data=data, mime_type=mime)
            | types.AudioContent(data=data, mime_type=mime)
        ):
            described = {"type": block.type, "mime_type": mime, "size": _decoded_size(data)}
        case types.ResourceLink():
            described = {
                "type": "resource_link",
                "uri": block.uri,
                "name": block.name,
                "mime_type": block.mime_type,
                "description": block.description,
                "size": block.size,
            }
        case types.EmbeddedResource(resource=types.TextResourceContents() as resource):
            described = {
                "type": "resource",
                "uri": resource.uri,
                "mime_type": resource.mime_type,
                "text": resource.text,
            }
        case types.EmbeddedResource(resource=types.BlobResourceContents() as resource):
            described = {
                "type": "resource",
                "uri": resource.uri,
                "mime_type": resource.mime_type,
                "size": _decoded_size(resource.blob),
            }
        case _:  # a kind of content newer than this gateway
            described = {"type": getattr(block, "type", "unknown")}
    return {k: v for k, v in described.items() if v is not None}


def tool_result(result: types.CallToolResult) -> Any:
    """What the model sees of a tool's result.

    Raises:
        ToolError: the tool reported an error (``isError``); its text is the message.
    """
    if result.is_error:
        texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
        raise ToolError("\n".join(texts).strip() or "the tool failed without saying why")
    if result.structured_content is not None:
        return result.structured_content
    content = result.content
    if len(content) == 1 and isinstance(content[0], types.TextContent):
        return content[0].text
    return [_block(b) for b in content]

"""An HTTP API described by an OpenAPI 3.x document as a tool backend: each operation a tool.

``OpenApiTools`` loads the document (a file or a URL) when it starts, makes a ``ToolDef`` of
every selected operation (its parameters and its JSON request body gathered in one input
schema, local ``$ref``s resolved) and calls the API with httpx. The document is the agent
author's, but real ones are large and imperfect: an operation the gateway cannot offer (a
request body that is not JSON, a ``$ref`` to another file, a schema too large once resolved)
is left out with a warning, unless the agent file names it in ``operations``.

Reading the document is ``document``'s; encoding a call's request and reading its answer is
``request``'s. This module ties them to the ``ToolBackend`` seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import structlog

from gateway.core.tool import ToolDef, check_tool, default_display_name
from gateway.errors import ConfigError, ToolError
from gateway.tools.base import NOBODY, BackendKind, Caller, ReportProgress, tool_name
from gateway.tools.entry import (
    EntryBackend,
    OpenApiEntry,
    check_options_known,
    expand_env,
    with_options,
)
from gateway.tools.openapi.document import (
    Resolver,
    Unusable,
    base_url,
    described,
    param_schema,
    parameters,
    parse_document,
    request_body,
)
from gateway.tools.openapi.request import (
    MAX_ANSWER_SIZE,
    Operation,
    Param,
    answer,
    build_request,
    read_body,
    status_line,
)

__all__ = ["OpenApiTools"]

log = structlog.get_logger("gateway.tools")

_METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
_PROPERTY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""Property names every model API accepts in a tool's input schema."""
_MAX_DOCUMENT_SIZE = 64 * 2**20
_MAX_LISTED = 50


class OpenApiTools(EntryBackend):
    """The operations of an OpenAPI 3.x document as a ``gateway.tools.base.ToolBackend``.

    Tools are named after the ``operationId`` (``getOrder`` -> ``get_order``), else after the
    method and path (``get_orders_order_id``). Their input schema has one property per path,
    query and header parameter (cookie ones are left out) and ``body`` for a JSON request
    body. A parameter whose name another location uses too (or ``body``) is prefixed with
    its location: ``path_id`` and ``query_id``. Calls are never retried: a POST runs once.

    Args:
        entry: the ``[[openapi]]`` settings of the agent file.
        base_dir: the agent file's directory; a relative ``document`` path is in it.

    Raises:
        ConfigError: a header names an environment variable that is not set.
    """

    kind: BackendKind = "openapi"

    def __init__(self, entry: OpenApiEntry, base_dir: Path) -> None:
        super().__init__(entry)
        self._entry = entry
        self._base_dir = base_dir
        self._headers = {
            key: expand_env(value, f"openapi:{entry.name}: header {key!r}")
            for key, value in entry.headers.items()
        }
        self._operations: dict[str, Operation] = {}
        self._definitions: list[ToolDef] = []
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        """Load the document and make a tool of each selected operation.

        Raises:
            ConfigError: the document cannot be read or fetched, is not OpenAPI 3.x, names
                no usable server (and ``base_url`` is not set), an operation the entry
                names is missing or unusable, two operations get the same tool name, or
                ``tool_options`` names a tool it does not offer. The message does not name
                the backend: the toolbox does.
        """
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    headers=self._headers, timeout=self._entry.timeout, follow_redirects=True
                )
            )
            document, url = await self._load(client)
            client.base_url = httpx.URL(base_url(document, url, self._entry.base_url))
            tools, skipped = self._tools(document)
            if not tools:
                raise ConfigError(f"document {self._entry.document}: no usable operation")
            check_options_known(self.name, self._entry.tool_options, list(tools))
            stack.pop_all()  # started: the client lives until aclose
        await self.aclose()  # started again: the new client replaces the old one
        self._client = client
        self._operations = {name: operation for name, (_, operation) in tools.items()}
        self._definitions = [
            with_options(definition, self._entry.tool_options.get(name))
            for name, (definition, _) in tools.items()
        ]
        log.info("openapi_loaded", backend=self.name, operations=len(tools), skipped=skipped)

    def definitions(self) -> list[ToolDef]:
        return list(self._definitions)

    def on_change(self, listener: Callable[[], None]) -> None:
        """The document is loaded once: the tools never change while the gateway runs."""

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,  # not sent: the agent file's headers speak for the gateway
    ) -> Any:
        """Send the operation's request; the answer's JSON (or text) is the result.

        Raises:
            ToolError: a status that is not 2xx (with an excerpt of the answer), no answer
                within ``timeout``, no connection, an answer over 8 MiB.
        """
        operation = self._operations.get(name)
        client = self._client
        if operation is None or client is None:
            raise ToolError(f"{self.name} offers no tool {name!r}")
        path, query, headers, content = build_request(operation, args)
        timeout = self._entry.timeout
        try:
            # httpx's timeout bounds each read; this one bounds the whole call.
            async with asyncio.timeout(timeout):
                async with client.stream(
                    operation.method,
                    path,
                    params=tuple(query),
                    headers=headers,
                    content=content,
                ) as response:
                    raw = await read_body(response, MAX_ANSWER_SIZE)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ToolError(f"no answer within {timeout:g} s") from exc
        except httpx.ConnectError as exc:
            where = client.base_url.netloc.decode()
            raise ToolError(f"cannot connect to {where}: {_cause(exc)}") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise ToolError(f"the request failed: {_cause(exc)}") from exc
        log.debug(
            "openapi_called",
            backend=self.name,
            tool=name,
            status=response.status_code,
            size=None if raw is None else len(raw),
        )
        return answer(response, raw)

    async def aclose(self) -> None:
        """Close the HTTP client (its pooled connections)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def _load(self, client: httpx.AsyncClient) -> tuple[dict[str, Any], str | None]:
        """The document and, when it came from the web, its URL (after redirects)."""
        source = self._entry.document
        if source.startswith(("http://", "https://")):
            raw, url = await self._fetch(client, source)
            return parse_document(raw, f"document {source}"), url
        path = self._base_dir / source
        try:
            raw = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise ConfigError(f"cannot read the document {path}: {exc.strerror or exc}") from exc
        return parse_document(raw, f"document {path}"), None

    async def _fetch(self, client: httpx.AsyncClient, url: str) -> tuple[bytes, str]:
        timeout = self._entry.timeout
        try:
            async with asyncio.timeout(timeout), client.stream("GET", url) as response:
                raw = await read_body(response, _MAX_DOCUMENT_SIZE)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ConfigError(f"document {url}: no answer within {timeout:g} s") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise ConfigError(f"document {url}: cannot fetch it: {_cause(exc)}") from exc
        if raw is None:
            raise ConfigError(f"document {url}: larger than {_MAX_DOCUMENT_SIZE // 2**20} MiB")
        if not response.is_success:
            raise ConfigError(f"document {url}: {status_line(response, raw)}")
        return raw, str(response.url)

    def _tools(
        self, document: Mapping[str, Any]
    ) -> tuple[dict[str, tuple[ToolDef, Operation]], int]:
        """The selected operations by tool name, and how many were left out as unusable."""
        wanted = _wanted(self._entry.operations)
        paths = document.get("paths") or {}
        tools: dict[str, tuple[ToolDef, Operation]] = {}
        labels: dict[str, str] = {}
        matched: set[str] = set()
        known: list[str] = []
        skipped = 0
        for path, item in paths.items():
            try:
                item = Resolver(document).deref(item)
            except Unusable as exc:
                raise ConfigError(f"paths {path!r}: {exc}") from exc
            if not isinstance(item, dict):
                raise ConfigError(f"paths {path!r}: not a Path Item object")
            for method in (m for m in item if m in _METHODS):
                operation = item[method]
                label = f"{method.upper()} {path}"
                op_id = operation.get("operationId") if isinstance(operation, dict) else None
                op_id = op_id if isinstance(op_id, str) and op_id else None
                known.append(op_id or label)
                if wanted is not None:
                    if not (hit := {key for key in (label, op_id) if key in wanted}):
                        continue
                    matched |= hit
                name = tool_name(op_id or f"{method}_{path}")
                shown = f"{op_id} ({label})" if op_id else label
                try:
                    built = self._operation(name, method, str(path), item, operation, document)
                except Unusable as exc:
                    if wanted is not None:
                        raise ConfigError(f"operation {shown}: {exc}") from exc
                    log.warning(
                        "openapi_operation_skipped",
                        backend=self.name,
                        operation=shown,
                        reason=str(exc),
                    )
                    skipped += 1
                    continue
                if name in tools:
                    raise ConfigError(
                        f"operations {labels[name]} and {shown} would both be tool {name!r}"
                    )
                tools[name], labels[name] = built, shown
        if wanted is not None and (missing := [wanted[k] for k in wanted if k not in matched]):
            listed = ", ".join(known[:_MAX_LISTED]) or "none"
            if len(known) > _MAX_LISTED:
                listed += f" and {len(known) - _MAX_LISTED} more"
            raise ConfigError(
                f"operations names {', '.join(map(repr, missing))}, which the document does"
                f" not have (operations: {listed})"
            )
        return tools, skipped

    def _operation(
        self,
        name: str,
        method: str,
        path: str,
        item: Mapping[str, Any],
        operation: Any,
        document: Mapping[str, Any],
    ) -> tuple[ToolDef, Operation]:
        """One operation as a tool and what calling it takes.

        Raises:
            Unusable: the gateway cannot offer it.
        """
        if not isinstance(operation, dict):
            raise Unusable("not an Operation object")
        resolver = Resolver(document)  # one schema budget per operation
        params = parameters(path, item, operation, resolver)
        body = request_body(operation.get("requestBody"), resolver)

        # A name used in two locations (or "body") is prefixed with its location in each.
        bases = [_property(p["name"]) for p in params]
        counts = Counter([*bases, *(["body"] if body else [])])
        properties: dict[str, Any] = {}
        required: list[str] = []
        plan: list[Param] = []
        for param, base in zip(params, bases, strict=True):
            where = param["in"]
            prop = _property(f"{where}_{base}") if counts[base] > 1 else base
            if prop in properties or (body and prop == "body"):
                raise Unusable(f"parameter {param['name']!r} ({where}) clashes with another")
            schema, as_json = param_schema(param, resolver)
            properties[prop] = described(schema, param.get("description"))
            if where == "path" or param.get("required") is True:
                required.append(prop)
            style = param.get("style") or ("form" if where == "query" else "simple")
            explode = param.get("explode", style == "form")
            plan.append(Param(param["name"], where, prop, str(style), explode is True, as_json))
        if body is not None:
            properties["body"] = body[1]
            if body[2]:
                required.append("body")

        summary, about = (_stripped(operation.get(key)) for key in ("summary", "description"))
        texts = dict.fromkeys(text for text in (summary, about) if text)
        short = 0 < len(summary) <= 60 and "\n" not in summary
        definition = ToolDef(
            name=name,
            description="\n\n".join(texts) or f"{method.upper()} {path} on {self._entry.name}",
            kind="server",
            input_schema={
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
            display_name=summary if short else default_display_name(name),
            read_only=method in ("get", "head"),
        )
        try:
            check_tool(definition)
        except ConfigError as exc:
            raise Unusable(str(exc)) from exc
        body_type = body[0] if body else None
        return definition, Operation(method.upper(), path, tuple(plan), body_type)


def _property(name: str) -> str:
    if _PROPERTY.match(name):
        return name
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "_"


def _wanted(operations: Sequence[str] | None) -> dict[str, str] | None:
    """``operations`` by key (an operationId, or ``METHOD /path``), each with its spelling."""
    if operations is None:
        return None
    wanted: dict[str, str] = {}
    for item in operations:
        method, _, path = item.strip().partition(" ")
        key = f"{method.upper()} {path.strip()}" if method.lower() in _METHODS and path else item
        wanted[key] = item
    return wanted


def _cause(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _stripped(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""

"""Reading an OpenAPI 3.x document: what ``gateway.tools.openapi.backend`` makes its tools of.

Parsing (JSON or YAML), local ``$ref`` resolution, OpenAPI 3.0's schema dialect as JSON Schema,
the server URL calls go to, and each operation's parameters and request body. Nothing here does
I/O: the backend fetches or reads the document and hands its bytes over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import yaml

from gateway.errors import ConfigError

__all__ = [
    "PATH_TEMPLATE",
    "Resolver",
    "Unusable",
    "base_url",
    "described",
    "is_json",
    "param_schema",
    "parameters",
    "parse_document",
    "request_body",
]

_LOCATIONS = ("path", "query", "header", "cookie")
_IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
"""Header parameters OpenAPI says to ignore: the client (here the agent file) sets them."""
PATH_TEMPLATE = re.compile(r"\{([^{}]+)\}")
"""A ``{name}`` in a path or a server URL: a parameter or a server variable."""
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""Schema keywords whose members are names, each holding a schema."""
_LITERAL = frozenset({"example", "examples", "default", "enum", "const"})
"""Schema keywords holding values, not schemas: a ``$ref`` key in them is data."""
_MAX_SCHEMA_NODES = 20_000
"""Nodes of one operation's schemas once its ``$ref``s are inlined: a document whose
references fan out (A uses B twice, B uses C twice...) would otherwise grow exponentially."""


class Unusable(Exception):
    """An operation the gateway cannot offer as a tool; the message says why."""


class _YamlLoader(yaml.SafeLoader):
    """YAML as JSON would have it: ``2024-01-01`` stays a string, not a date."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def parse_document(raw: bytes, where: str) -> dict[str, Any]:
    """The document, checked to be OpenAPI 3.x.

    Args:
        raw: the document's bytes, JSON or YAML.
        where: what the messages call it (``document shop.yaml``).

    Raises:
        ConfigError: it is neither JSON nor YAML, or not an OpenAPI 3.x document.
    """
    try:
        try:
            document = json.loads(raw)
        except ValueError:
            document = yaml.load(raw, Loader=_YamlLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{where}: neither JSON nor YAML ({reason})") from exc
    except RecursionError as exc:
        raise ConfigError(f"{where}: nested too deeply") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: not an OpenAPI document (it is {_json_type(document)})")
    version = document.get("openapi")
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)  # YAML reads `openapi: 3.1` as a number
    if version is None and "swagger" in document:
        raise ConfigError(
            f"{where}: a Swagger {document['swagger']} document, not OpenAPI 3.x"
            " (convert it, e.g. with swagger2openapi)"
        )
    if version is None:
        raise ConfigError(f"{where}: not an OpenAPI document (no 'openapi' field)")
    if not isinstance(version, str) or not version.startswith("3."):
        raise ConfigError(f"{where}: OpenAPI {version}, not 3.x")
    if not isinstance(document.get("paths", {}), dict):
        raise ConfigError(f"{where}: 'paths' is not an object")
    return document


def _json_type(value: Any) -> str:
    kinds = ((str, "a string"), (list, "an array"), (bool, "a boolean"), (int | float, "a number"))
    for kind, name in kinds:
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def base_url(document: Mapping[str, Any], url: str | None, configured: str | None) -> str:
    """The URL the API's paths are relative to.

    Args:
        document: the parsed document.
        url: the document's own URL (after redirects), or ``None`` when read from a file.
        configured: the entry's ``base_url``, which wins over the document's servers.

    Raises:
        ConfigError: ``configured`` is not an http(s) URL, or the document names no server
            that makes an absolute http(s) URL.
    """
    if configured is not None:
        if not _absolute(configured):
            raise ConfigError(f"base_url {configured!r} is not an http(s) URL")
        return configured
    servers = document.get("servers")
    if not isinstance(servers, list) or not servers or not isinstance(servers[0], dict):
        # OpenAPI's default server is "/": the document's own host.
        if url is None:
            raise ConfigError("the document names no server: set base_url")
        return urljoin(url, "/")
    server = _server_url(servers[0])
    if url is not None:
        server = urljoin(url, server)
    if not _absolute(server):
        raise ConfigError(
            f"the document's server URL {server!r} is not an absolute http(s) URL: set base_url"
        )
    return server


def _server_url(server: Mapping[str, Any]) -> str:
    """The server's URL with its variables set to their defaults."""
    url = server.get("url", "/")
    variables = server.get("variables")
    if not isinstance(url, str):
        raise ConfigError("the document's first server has no URL: set base_url")

    def default(match: re.Match[str]) -> str:
        spec = variables.get(match.group(1)) if isinstance(variables, dict) else None
        if not isinstance(spec, dict) or "default" not in spec:
            raise ConfigError(
                f"server URL {url!r}: variable {match.group(1)!r} has no default: set base_url"
            )
        return str(spec["default"])

    return PATH_TEMPLATE.sub(default, url)


def _absolute(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


class Resolver:
    """Local ``$ref``s of one document (JSON pointers: ``#/components/schemas/Order``).

    Inlining counts the nodes it makes: use one resolver per operation, its schema budget.
    """

    def __init__(self, document: Mapping[str, Any]) -> None:
        self._document = document
        self._nodes = 0

    def deref(self, node: Any) -> Any:
        """``node``, or the object its chain of ``$ref``s ends at (not inlined).

        Raises:
            Unusable: a ``$ref`` does not resolve, points outside the document or in a loop.
        """
        seen: set[str] = set()
        while isinstance(node, dict) and isinstance(ref := node.get("$ref"), str):
            if ref in seen:
                raise Unusable(f"$ref {ref!r} refers to itself")
            seen.add(ref)
            node = self._target(ref)
        return node

    def schema(self, node: Any) -> Any:
        """``node`` with every ``$ref`` in it replaced by what it refers to, as JSON Schema.

        Raises:
            Unusable: a ``$ref`` does not resolve, or the schema is too large or too deep.
        """
        try:
            return self._inline(node, ())
        except RecursionError as exc:
            raise Unusable("a schema is nested too deeply") from exc

    def _inline(self, node: Any, trail: tuple[str, ...], *, names: bool = False) -> Any:
        self._nodes += 1
        if self._nodes > _MAX_SCHEMA_NODES:
            raise Unusable(
                f"its schemas are larger than {_MAX_SCHEMA_NODES} nodes once $refs are resolved"
            )
        if isinstance(node, list):
            return [self._inline(value, trail) for value in node]
        if not isinstance(node, dict):
            return node
        if names:
            return {key: self._inline(value, trail) for key, value in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in trail:
                # A recursive schema (a tree, a linked list) is unrolled once; where it
                # refers to itself again any value is accepted, or inlining would never end.
                return {}
            target = self._inline(self._target(ref), (*trail, ref))
            siblings = {key: value for key, value in node.items() if key != "$ref"}
            if not siblings or not isinstance(target, dict):
                return target
            return {**target, **self._inline(siblings, trail)}  # 3.1: siblings refine it
        schema = {
            key: value if key in _LITERAL else self._inline(value, trail, names=key in _NAMED)
            for key, value in node.items()
        }
        return _json_schema(schema)

    def _target(self, ref: str) -> Any:
        pointer = unquote(ref[1:]) if ref.startswith("#") else None
        if pointer is None or (pointer and not pointer.startswith("/")):
            raise Unusable(f"$ref {ref!r}: only references inside the document are resolved")
        node: Any = self._document
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise Unusable(f"$ref {ref!r} does not resolve")
        return node


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI 3.0's schema dialect as the JSON Schema (2020-12) arguments are checked with:
    ``nullable`` becomes a ``null`` type, a boolean ``exclusiveMinimum``/``exclusiveMaximum``
    its numeric form. A 3.1 schema has neither and is left as it is."""
    if schema.pop("nullable", False) is True:
        if isinstance(kind := schema.get("type"), str):
            schema["type"] = [kind, "null"]
        if isinstance(enum := schema.get("enum"), list) and None not in enum:
            schema["enum"] = [*enum, None]
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = schema.get(exclusive)
        if isinstance(flag, bool):
            del schema[exclusive]
            if flag and bound in schema:
                schema[exclusive] = schema.pop(bound)
    return schema


def parameters(
    path: str, item: Mapping[str, Any], operation: Mapping[str, Any], resolver: Resolver
) -> list[dict[str, Any]]:
    """The Parameter objects a call of ``operation`` (on ``path``, in ``item``) sends.

    The path item's and the operation's own (which win), less cookie parameters and the
    headers OpenAPI says to ignore.

    Raises:
        Unusable: a parameter is not a Parameter object, or a path parameter is not declared.
    """
    declared: dict[tuple[str, str], dict[str, Any]] = {}
    for raw in [*_list(item.get("parameters")), *_list(operation.get("parameters"))]:
        param = resolver.deref(raw)  # the operation's own come last, and win
        if (
            not isinstance(param, dict)
            or not isinstance(param.get("name"), str)
            or param.get("in") not in _LOCATIONS
        ):
            raise Unusable(f"a parameter is not a Parameter object: {str(raw)[:80]}")
        declared[(param["in"], param["name"])] = param
    params = [
        p
        for (where, pname), p in declared.items()
        if where != "cookie" and not (where == "header" and pname.lower() in _IGNORED_HEADERS)
    ]
    if undeclared := set(PATH_TEMPLATE.findall(path)) - {
        p["name"] for p in params if p["in"] == "path"
    }:
        raise Unusable(f"path parameters not declared: {', '.join(sorted(undeclared))}")
    return params


def request_body(raw: Any, resolver: Resolver) -> tuple[str, Any, bool] | None:
    """The JSON request body: its media type, schema and whether it is required.

    ``None`` when the operation has no body, or an optional one that is not JSON.

    Raises:
        Unusable: ``raw`` is not a Request Body object, or a required body is not JSON.
    """
    if raw is None:
        return None
    body = resolver.deref(raw)
    if not isinstance(body, dict):
        raise Unusable("its requestBody is not a Request Body object")
    content = body.get("content")
    content = content if isinstance(content, dict) else {}
    required = body.get("required") is True
    for media_type, media in content.items():
        if is_json(media_type):
            schema = resolver.schema(media.get("schema", {}) if isinstance(media, dict) else {})
            return (
                media_type.split(";")[0].strip(),
                described(schema, body.get("description")),
                required,
            )
    if required:
        raise Unusable(f"its request body is not JSON ({', '.join(content) or 'no content'})")
    return None  # an optional body the gateway cannot send: calls go without one


def param_schema(param: Mapping[str, Any], resolver: Resolver) -> tuple[Any, bool]:
    """A parameter's schema, and whether its value is sent as JSON (``content``)."""
    if "schema" in param:
        return resolver.schema(param["schema"]), False
    content = param.get("content")
    if isinstance(content, dict) and content:
        media = next(iter(content.values()))
        return resolver.schema(media.get("schema", {}) if isinstance(media, dict) else {}), True
    return {"type": "string"}, False


def described(schema: Any, description: Any) -> Any:
    """``schema`` with ``description`` (when it is a non-blank string) added to it."""
    if schema is True:
        schema = {}
    if isinstance(schema, dict) and isinstance(description, str) and description.strip():
        return {**schema, "description": description.strip()}
    return schema


def is_json(media_type: str) -> bool:
    """Whether ``media_type`` (parameters allowed) is JSON: ``application/json`` or ``+json``."""
    base = media_type.split(";")[0].strip().lower()
    return base == "application/json" or (
        base.startswith("application/") and base.endswith("+json")
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

"""Limits on client-function schemas, and the cache of the ones already checked (pure).

jsonschema's own check of a schema (``check_schema``) costs about half a millisecond per
subschema on the event loop and recurses: a frame under 1 MiB could freeze every session
for a minute, and a deep one exhaust the stack. So one iterative walk, linear in the
schema and stopping at the first limit crossed, comes first; only schemas within the
limits reach ``check_schema``. The walk also refuses what could make checking a value
reach the network or run long: a ``$ref`` that is not a JSON pointer into the schema
itself (and every keyword that changes the base URI), ``$ref`` cycles, a ``$ref`` that
resolves to nothing, and regexes that are too long or that RE2 cannot run.

A schema is checked and compiled once: the result (validator or refusal) is kept under
the schema's canonical JSON, for every session of the gateway.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import msgspec

if TYPE_CHECKING:
    from gateway.core.schema import SchemaValidator

__all__ = ["SchemaBudget", "SchemaGuard", "SchemaLimits", "Verdict", "check_schemas"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_BASE_KEYWORDS = frozenset(
    {"$id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveRef", "$recursiveAnchor"}
)
"""Keywords that name or change a base URI; a client schema resolves only local pointers."""
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
"""Their values are data, not subschemas: not counted as nodes, still bounded in depth."""
_MAX_REF_CHAIN = 16

Verdict = tuple[str | None, int]
"""Why a schema is refused (``None``: it is fine), and its nodes."""
_Entry = tuple["SchemaValidator | str", int]
"""A checked schema: its validator or why it is refused, and its nodes."""


def check_schemas(schemas: list[dict[str, Any]], limits: SchemaLimits) -> list[Verdict]:
    """Check ``schemas`` (the costly part: the walk, then jsonschema's ``check_schema``).

    A plain function of plain data, so it can run in another process; give the result to
    ``SchemaGuard.store``.
    """
    return [_verdict(schema, limits) for schema in schemas]


def _verdict(schema: dict[str, Any], limits: SchemaLimits) -> Verdict:
    try:
        nodes = _walk(schema, limits)
    except _Refused as exc:
        return str(exc), 0
    from gateway.core.schema import schema_problem  # jsonschema: at the first check

    return schema_problem(schema), nodes


def _entry(schema: dict[str, Any], verdict: Verdict, limits: SchemaLimits) -> _Entry:
    problem, nodes = verdict
    if problem is not None:
        return problem, nodes
    from gateway.core.schema import SchemaValidator  # jsonschema: at the first check

    return SchemaValidator(schema, max_steps=limits.max_check_steps), nodes


def _over(limit: int | None, value: int) -> bool:
    return limit is not None and value > limit


class SchemaLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What one declaration of client functions may hold; ``None`` disables a limit."""

    max_size: int | None = None
    """Bytes of canonical JSON of one schema."""
    max_total_size: int | None = None
    """Bytes of canonical JSON of all the schemas of one declaration."""
    max_depth: int | None = None
    """Nesting of objects and arrays in one schema."""
    max_nodes: int | None = None
    """Object members and array items of all the schemas of one declaration."""
    max_pattern_length: int | None = None
    """Characters of one regex."""
    max_check_steps: int | None = None
    """Keyword evaluations one check of a value against a schema may take."""


@dataclass
class SchemaBudget:
    """What one declaration (``session.start`` or ``session.update``) has used so far."""

    nodes: int = 0
    size: int = 0


class _Refused(Exception):
    """A schema crossed a limit; the message names it."""


class SchemaGuard:
    """Checks client-function schemas against ``limits``, then compiles them, once each.

    Args:
        limits: the limits every schema and declaration must stay within.
        cache_size: compiled schemas (and refusals) kept, least recently used dropped.
    """

    def __init__(self, limits: SchemaLimits, cache_size: int = 256) -> None:
        self.limits = limits
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, _Entry] = OrderedDict()

    def compile(self, schema: dict[str, Any], budget: SchemaBudget) -> SchemaValidator | str:
        """The validator of ``schema``, or why it is refused (naming the limit).

        ``budget`` accumulates the nodes and bytes of one declaration across calls.
        """
        limits = self.limits
        try:
            key = msgspec.json.encode(schema, order="sorted")
        except RecursionError:
            return _too_deep(limits.max_depth)
        budget.size += len(key)
        if _over(limits.max_size, len(key)):
            return (
                f"the schema has {len(key)} bytes of JSON; the limit is {limits.max_size}"
                " (tool_schema_max_size)"
            )
        if _over(limits.max_total_size, budget.size):
            return (
                f"the schemas have more than {limits.max_total_size} bytes of JSON together"
                " (client_functions_max_size)"
            )
        entry = self._cache.get(key)
        if entry is None:
            entry = _entry(schema, _verdict(schema, limits), limits)
        self._keep(key, entry)
        compiled, nodes = entry
        budget.nodes += nodes
        if limits.max_nodes is not None and budget.nodes > limits.max_nodes:
            return _too_many(limits.max_nodes)
        return compiled

    def unchecked(self, schemas: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The schemas of one declaration that ``compile`` would check anew (not cached and
        within the limits), so that the caller can check them elsewhere first
        (``check_schemas``, then ``store``). It stops where the declaration crosses a
        limit: the rest is refused anyway."""
        limits = self.limits
        budget = SchemaBudget()
        found: list[dict[str, Any]] = []
        for schema in schemas:
            try:
                key = msgspec.json.encode(schema, order="sorted")
            except RecursionError:
                break
            budget.size += len(key)
            if _over(limits.max_size, len(key)) or _over(limits.max_total_size, budget.size):
                break
            entry = self._cache.get(key)
            if entry is None:
                try:
                    budget.nodes += _walk(schema, limits)
                except _Refused:
                    break
                found.append(schema)
            else:
                budget.nodes += entry[1]
            if _over(limits.max_nodes, budget.nodes):
                break
        return found

    def store(self, schemas: list[dict[str, Any]], verdicts: list[Verdict]) -> None:
        """Keep what ``check_schemas`` (run elsewhere) found, as ``compile`` would have."""
        for schema, verdict in zip(schemas, verdicts, strict=True):
            key = msgspec.json.encode(schema, order="sorted")
            self._keep(key, _entry(schema, verdict, self.limits))

    def _keep(self, key: bytes, entry: _Entry) -> None:
        if self._cache_size > 0:
            self._cache[key] = entry
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def __len__(self) -> int:
        return len(self._cache)


def _walk(schema: dict[str, Any], limits: SchemaLimits) -> int:
    """Check the limits in one pass; return the schema's nodes, ``$ref`` targets counted
    where they are used.

    Raises:
        _Refused: naming the first limit crossed.
    """
    max_depth, max_nodes = limits.max_depth, limits.max_nodes
    nodes = 0
    refs: list[str] = []
    seen: set[str] = set()
    # (value, depth, is data, is the object of patternProperties)
    stack: list[tuple[Any, int, bool, bool]] = [(schema, 1, False, False)]
    while stack:
        node, depth, data, pattern_keys = stack.pop()
        if max_depth is not None and depth > max_depth:
            raise _Refused(_too_deep(max_depth))
        if isinstance(node, list):
            nodes += 0 if data else len(node)
            stack.extend((item, depth + 1, data, False) for item in node if _nested(item))
        else:
            nodes += 0 if data else len(node)
            for key, value in node.items():
                if not data:
                    _check_keyword(key, value, limits, refs, pattern_keys)
                    seen.add(key)
                if _nested(value):
                    in_data = data or key in _DATA_KEYWORDS
                    stack.append((value, depth + 1, in_data, key == "patternProperties"))
        if max_nodes is not None and nodes > max_nodes:
            raise _Refused(_too_many(max_nodes))
    if {"patternProperties", "unevaluatedProperties"} <= seen:
        # jsonschema matches patternProperties with Python's backtracking re there.
        raise _Refused("patternProperties and unevaluatedProperties cannot be combined")
    if refs:
        nodes = _count_refs(schema, refs, nodes, max_nodes)
    return nodes


def _nested(value: object) -> bool:
    return isinstance(value, dict | list)


def _check_keyword(
    key: str, value: object, limits: SchemaLimits, refs: list[str], pattern_key: bool
) -> None:
    """Refuse remote references and costly regexes. Applied to every object member, not
    only where a keyword is one, which may refuse an odd schema but never misses one."""
    if pattern_key:
        _check_pattern(key, limits)
    if not isinstance(value, str):
        return
    if key == "pattern":
        _check_pattern(value, limits)
    elif key == "$ref":
        if value != "#" and not value.startswith("#/"):
            raise _Refused(
                f"$ref {value[:64]!r} is not a JSON pointer into the schema itself;"
                " nothing is fetched"
            )
        refs.append(value)
    elif key in _BASE_KEYWORDS:
        raise _Refused(f"{key} is not allowed in client functions; use $defs and '#/' $refs")
    elif key == "$schema" and value.rstrip("#") != _DIALECT:
        raise _Refused(f"$schema must be {_DIALECT!r} (JSON Schema 2020-12) when present")


def _check_pattern(pattern: str, limits: SchemaLimits) -> None:
    limit = limits.max_pattern_length
    if limit is not None and len(pattern) > limit:
        raise _Refused(
            f"a regex has {len(pattern)} characters; the limit is {limit}"
            " (max_schema_pattern_length)"
        )
    from gateway.core.schema import pattern_problem  # RE2: at the first pattern

    problem = pattern_problem(pattern)
    if problem is not None:
        raise _Refused(problem)


def _too_deep(max_depth: int | None) -> str:
    return f"the schema is nested deeper than {max_depth} (max_schema_depth)"


def _too_many(max_nodes: int) -> str:
    return (
        f"the schemas have more than {max_nodes} nodes (members and items,"
        " $ref targets counted where used) (max_schema_nodes)"
    )


def _count_refs(root: dict[str, Any], refs: list[str], nodes: int, max_nodes: int | None) -> int:
    """Add, for each ``$ref``, the size of what it points to, references expanded: a few
    references to references would otherwise make checking a value exponential."""
    sizes: dict[str, int] = {}
    for ref in refs:
        nodes += _expanded(root, ref, sizes, ())
        if max_nodes is not None and nodes > max_nodes:
            raise _Refused(_too_many(max_nodes))
    return nodes


def _expanded(root: dict[str, Any], ref: str, sizes: dict[str, int], chain: tuple[str, ...]) -> int:
    if ref in sizes:
        return sizes[ref]
    if ref in chain:
        raise _Refused(f"$ref {ref[:64]!r} is recursive; client functions cannot recurse")
    if len(chain) >= _MAX_REF_CHAIN:
        raise _Refused(f"$refs lead to $refs more than {_MAX_REF_CHAIN} times")
    target = _resolve(root, ref)
    size, inner = _plain_size(target)
    size += sum(_expanded(root, r, sizes, (*chain, ref)) for r in inner)
    sizes[ref] = size
    return size


def _resolve(root: dict[str, Any], ref: str) -> object:
    node: object = root
    for raw in ref[2:].split("/") if ref != "#" else ():
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _Refused(f"$ref {ref[:64]!r} points to nothing in the schema")
    return node


def _plain_size(target: object) -> tuple[int, list[str]]:
    """Nodes under ``target`` (not data) and the ``$ref``s it holds."""
    size, refs = 0, []
    stack: list[tuple[object, bool]] = [(target, False)]
    while stack:
        node, data = stack.pop()
        if isinstance(node, list):
            size += 0 if data else len(node)
            stack.extend((item, data) for item in node if _nested(item))
        elif isinstance(node, dict):
            size += 0 if data else len(node)
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str) and not data:
                    refs.append(value)
                if _nested(value):
                    stack.append((value, data or key in _DATA_KEYWORDS))
    return size, refs

"""JSON Schema checks for tool arguments and results (pure, no I/O).

Schemas may come from clients, so checking a value against one must neither reach the
network nor run away:

- ``$ref`` is resolved only inside the schema itself: the registry refuses to retrieve
  anything (``gateway.core.schema_guard`` refuses non-local references before this point).
- Regexes (``pattern``, ``patternProperties`` and the ``additionalProperties`` that
  depends on them) run on RE2, whose matching time is linear in the text, instead of
  Python's backtracking ``re``: a pattern such as ``^(a+)+$`` cannot freeze the loop.
  Patterns RE2 cannot run (backreferences, lookaround) are refused when declared.
- Checking one value takes at most ``max_steps`` keyword evaluations: a 1 MiB array
  checked against ``anyOf`` branches would otherwise hold the loop for seconds.
- A value that cannot be checked (too costly, or a recursive ``$ref`` on deeply nested
  data) is reported as a failure, never raised.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import re2  # type: ignore[import-untyped]
import referencing
import referencing.exceptions

__all__ = ["SchemaValidator", "pattern_problem", "schema_problem"]

_Draft = jsonschema.Draft202012Validator
_MAX_PROBLEM_CHARS = 1_000
"""jsonschema quotes the whole value in its messages; the error event needs no more."""
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the client's, not worth stderr


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern, options=_RE2_OPTIONS)


def pattern_problem(pattern: str) -> str | None:
    """Say why RE2 cannot run ``pattern``, or ``None`` when it can."""
    try:
        _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        return f"regex {pattern[:64]!r} is not supported (RE2 syntax, no lookaround): {reason}"
    return None


def _search(pattern: str, text: str) -> bool:
    return _compiled(pattern).search(text) is not None


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance[:64]!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(key) for key in sorted(extras))
        yield jsonschema.ValidationError(f"Additional properties are not allowed ({listed})")


class _TooCostly(Exception):
    """A value took more keyword evaluations than its check may use."""


class _Steps:
    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


_steps: ContextVar[_Steps | None] = ContextVar("gateway_schema_steps", default=None)


def _counted(name: str, keyword: Callable[..., Any]) -> Callable[..., Any]:
    """Count each evaluation of ``keyword`` against the running check's steps."""

    def counted(validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
        steps = _steps.get()
        if steps is not None:
            steps.left -= _cost(name, value, instance)
            if steps.left < 0:
                raise _TooCostly
        return keyword(validator, value, instance, schema)

    return counted


_PER_ITEM = frozenset(
    {
        "items",
        "contains",
        "additionalProperties",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
"""Keywords that visit every item or member of the value (even with an empty subschema)."""


def _cost(name: str, value: Any, instance: Any) -> int:
    """Steps one evaluation takes: one, plus the work of keywords that loop by themselves."""
    if name in _PER_ITEM and isinstance(instance, list | dict):
        return 1 + len(instance)
    if name == "patternProperties" and isinstance(instance, dict) and isinstance(value, dict):
        return 1 + len(value) * (len(instance) + sum(map(len, instance)) // 32)
    if name == "pattern" and isinstance(instance, str):
        return 1 + len(instance) // 32  # RE2 is linear in the text (some 60 ns a character)
    if name == "enum" and isinstance(value, list):
        return 1 + len(value)  # the value is compared with each member
    if name == "uniqueItems" and value is True and isinstance(instance, list):
        return 1 + len(instance) ** 2 // 2  # pairs, when the items cannot be sorted
    return 1


_KEYWORDS = {
    **_Draft.VALIDATORS,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}
_Linear = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    _Draft, validators={name: _counted(name, keyword) for name, keyword in _KEYWORDS.items()}
)


def _no_retrieval(uri: str) -> referencing.Resource[Any]:
    # referencing's attrs classes are opaque to mypy, hence the ignores.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


_LOCAL_ONLY: referencing.Registry[Any] = referencing.Registry(
    retrieve=_no_retrieval  # type: ignore[call-arg]
)


def schema_problem(schema: object) -> str | None:
    """Say why ``schema`` is not a valid JSON Schema (2020-12), or ``None`` when it is."""
    if not isinstance(schema, dict):
        return "a schema must be a JSON object"
    try:
        _Draft.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return f"invalid JSON Schema: {exc.message}"
    except RecursionError:
        return "invalid JSON Schema: nested too deeply"
    return None


class SchemaValidator:
    """A compiled schema; ``problem(value)`` explains the first violation, if any.

    Args:
        schema: a schema that passed ``schema_problem``.
        max_steps: keyword evaluations one check may take (each costs about 10 µs; an
            ``enum`` one step per member, ``uniqueItems`` one per pair of items); past
            them the value fails as too costly to check. ``None`` (for the agent's own,
            trusted tools) checks without bound.
    """

    __slots__ = ("_max_steps", "_validator")

    def __init__(self, schema: dict[str, Any], max_steps: int | None = None) -> None:
        self._validator = _Linear(schema, registry=_LOCAL_ONLY)
        self._max_steps = max_steps

    def problem(self, value: object) -> str | None:
        """Return a one-line description of why ``value`` fails, or ``None`` if it passes."""
        token = _steps.set(None if self._max_steps is None else _Steps(self._max_steps))
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        except _TooCostly:
            return (
                f"value: too large to check against the schema"
                f" (more than {self._max_steps} steps, max_schema_check_steps)"
            )
        except RecursionError:
            return "value: nested too deeply to check against the schema"
        except referencing.exceptions.Unresolvable as exc:
            return f"value: the schema has a reference that does not resolve: {exc}"
        finally:
            _steps.reset(token)
        if error is None:
            return None
        where = "".join(f"[{part!r}]" for part in error.absolute_path)
        return f"{where or 'value'}: {error.message}"[:_MAX_PROBLEM_CHARS]

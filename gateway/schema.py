"""JSON Schema checks for tool arguments and results (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

__all__ = ["SchemaValidator", "schema_problem"]

_Draft = jsonschema.Draft202012Validator


def schema_problem(schema: object) -> str | None:
    """Say why ``schema`` is not a valid JSON Schema (2020-12), or ``None`` when it is."""
    if not isinstance(schema, dict):
        return "a schema must be a JSON object"
    try:
        _Draft.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return f"invalid JSON Schema: {exc.message}"
    return None


class SchemaValidator:
    """A compiled schema; ``problem(value)`` explains the first violation, if any."""

    __slots__ = ("_validator",)

    def __init__(self, schema: dict[str, Any]) -> None:
        self._validator = _Draft(schema)

    def problem(self, value: object) -> str | None:
        """Return a one-line description of why ``value`` fails, or ``None`` if it passes."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is None:
            return None
        where = "".join(f"[{part!r}]" for part in error.absolute_path)
        return f"{where or 'value'}: {error.message}"

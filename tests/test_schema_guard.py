"""The cheap walk over client-function schemas, the validator cache and linear-time regexes
(pure core: no sockets)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.schema import SchemaValidator
from gateway.core.schema_guard import SchemaBudget, SchemaGuard, SchemaLimits
from gateway.core.tool import ToolDef, ToolRegistry
from gateway.errors import ConfigError

LIMITS = SchemaLimits(
    max_size=4096, max_total_size=8192, max_depth=8, max_nodes=60, max_pattern_length=32
)


def check(schema: dict[str, Any], limits: SchemaLimits = LIMITS) -> str | None:
    compiled = SchemaGuard(limits).compile(schema, SchemaBudget())
    return compiled if isinstance(compiled, str) else None


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"not": schema}
    return schema


def test_a_schema_within_the_limits_passes():
    schema = {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["zip"],
        "$defs": {"n": {"type": "integer"}},
        "additionalProperties": {"$ref": "#/$defs/n"},
    }
    assert check(schema) is None


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (nested(8), "max_schema_depth"),
        ({"enum": [[[[[[[[[1]]]]]]]]]}, "max_schema_depth"),
        ({"allOf": [{}] * 61}, "max_schema_nodes"),
        ({"enum": ["x" * 5000]}, "tool_schema_max_size"),
        ({"pattern": "a" * 33}, "max_schema_pattern_length"),
        ({"patternProperties": {"b" * 33: {}}}, "max_schema_pattern_length"),
        ({"pattern": "(?=a)"}, "RE2"),
        ({"$ref": "other.json"}, "JSON pointer"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "recursive"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef"),
        ({"$anchor": "x"}, "$anchor"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "2020-12"),
        ({"patternProperties": {"^a": {}}, "unevaluatedProperties": False}, "combined"),
        ({"type": "nonsense"}, "invalid JSON Schema"),
    ],
)
def test_limits_and_unsafe_keywords_are_refused_naming_why(schema, words):
    problem = check(schema)
    assert problem is not None
    assert words in problem


def test_ref_targets_count_where_they_are_used():
    # A 21-node definition: one reference makes 26 + 21 nodes, two make 28 + 42 (> 60).
    defs = {"d": {"properties": {f"p{i}": {} for i in range(20)}}}
    schema = {"$defs": defs, "allOf": [{"$ref": "#/$defs/d"}, {"$ref": "#/$defs/d"}]}
    assert "max_schema_nodes" in (check(schema) or "")
    assert check({"$defs": defs, "allOf": [{"$ref": "#/$defs/d"}]}) is None


def test_data_under_enum_is_not_counted_as_nodes():
    assert check({"enum": list(range(500))}) is None


def test_the_declaration_shares_one_budget():
    guard = SchemaGuard(LIMITS)
    budget = SchemaBudget()
    half = {"allOf": [{}] * 35}
    assert not isinstance(guard.compile(half, budget), str)
    assert "max_schema_nodes" in str(guard.compile(half, budget))
    size = SchemaBudget()
    big = {"enum": ["x" * 3000]}
    assert not isinstance(guard.compile(big, size), str)
    assert not isinstance(guard.compile(big, size), str)
    assert "client_functions_max_size" in str(guard.compile(big, size))


def test_a_schema_is_checked_and_compiled_once():
    guard = SchemaGuard(LIMITS, cache_size=2)
    first = guard.compile({"type": "object", "b": 1, "a": 2}, SchemaBudget())
    again = guard.compile({"a": 2, "b": 1, "type": "object"}, SchemaBudget())  # same, reordered
    assert first is again
    guard.compile({"type": "string"}, SchemaBudget())
    guard.compile({"type": "integer"}, SchemaBudget())
    assert len(guard) == 2


def test_extending_a_registry_reuses_its_checked_tools():
    agent = ToolRegistry(
        [ToolDef(name="mine", description="d", kind="server", input_schema={"type": "object"})]
    )
    schema = {"type": "object", "not": nested(3)}
    client = ToolDef(name="theirs", description="d", kind="client", input_schema=schema)
    guard = SchemaGuard(LIMITS)
    extended = agent.extended([client], guard)
    assert extended.get("mine") is agent.get("mine")
    deep = {"type": "object", "not": nested(20)}
    too_deep = ToolDef(name="deep", description="d", kind="client", input_schema=deep)
    with pytest.raises(ConfigError, match="max_schema_depth"):
        agent.extended([too_deep], guard)


def test_a_catastrophic_pattern_is_matched_in_linear_time():
    # With Python's re, each of these takes longer than the age of the universe.
    validator = SchemaValidator(
        {
            "type": "object",
            "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}},
            "patternProperties": {"^(b+)+$": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    assert "does not match" in str(validator.problem({"v": "a" * 100 + "!"}))
    assert "not allowed" in str(validator.problem({"b" * 100 + "!": 1}))
    assert "is not of type" in str(validator.problem({"b" * 100: "x"}))
    assert validator.problem({"v": "aaa", "bb": 1}) is None


def test_a_schema_that_cannot_be_checked_reports_instead_of_raising():
    # Built directly, past the guard: a recursive and a remote $ref. Nothing is fetched.
    assert "nested too deeply" in str(SchemaValidator({"$ref": "#"}).problem(1))
    remote = SchemaValidator({"$ref": "http://127.0.0.1:9/schema.json"})
    assert "does not resolve" in str(remote.problem(1))


def test_checking_a_value_stops_after_its_steps():
    # Each item tries 20 branches: 20 000 items would take seconds unbounded.
    schema = {"type": "array", "items": {"anyOf": [{"minimum": i} for i in range(20)]}}
    validator = SchemaValidator(schema, max_steps=1_000)
    assert "max_schema_check_steps" in str(validator.problem(list(range(-20_000, 0))))
    assert validator.problem([30, 40]) is None
    assert SchemaValidator(schema, max_steps=None).problem([-1] * 100) is not None


def test_the_guard_gives_its_validators_the_step_limit():
    limits = SchemaLimits(max_check_steps=10)
    schema = {"type": "array", "items": {"type": "integer"}}
    compiled = SchemaGuard(limits).compile(schema, SchemaBudget())
    assert isinstance(compiled, SchemaValidator)
    assert "max_schema_check_steps" in str(compiled.problem([1] * 20))

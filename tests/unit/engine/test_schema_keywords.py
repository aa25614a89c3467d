"""CONSTRAIN-4: schema keywords the grammar would drop are found, wherever they sit, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from reference_server.engine.schema_keywords import unenforced_keyword


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"not": {"type": "string"}}, "'not' at /"),
        (
            {"type": "object", "properties": {"x": {"$ref": "https://example.invalid/s.json"}}},
            "another document",
        ),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
        (
            {"type": "object", "properties": {"a": {"type": "array", "contains": {"minimum": 5}}}},
            "/properties/a",
        ),
        ({"if": {"type": "integer"}, "then": {"minimum": 5}}, "'if'"),
        ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "'allOf' of 2"),
        ({"$defs": {"a": {"dependentRequired": {"x": ["y"]}}}, "$ref": "#/$defs/a"}, "/$defs/a"),
        (
            {"anyOf": [{"type": "integer"}, {"type": "array", "prefixItems": [{"not": {}}]}]},
            "/anyOf/1/prefixItems/0",
        ),
    ],
)
def test_an_unenforced_keyword_is_found_and_placed(schema: dict[str, Any], named: str) -> None:
    found = unenforced_keyword(schema)
    assert found is not None and named in found


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}},
        {"enum": [{"not": 1}], "const": {"uniqueItems": True}, "default": {"if": 1}},
        {"$defs": {"a": {"type": "integer", "minimum": 1}}, "$ref": "#/$defs/a"},
        {"allOf": [{"type": "integer", "minimum": 5}]},
        {"type": "string", "format": "email", "pattern": "^a", "description": "not a keyword here"},
        True,
    ],
)
def test_enforced_keywords_names_and_data_pass(schema: Any) -> None:
    assert unenforced_keyword(schema) is None

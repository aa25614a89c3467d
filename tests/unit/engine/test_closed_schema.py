"""engine/closed_schema.py: which objects are closed to the properties they name, and which are
left open because another schema describes the same instance."""

from __future__ import annotations

from typing import Any

import pytest

from reference_server.engine.closed_schema import closed

NAMED: dict[str, Any] = {"properties": {"a": {}}}
CLOSED: dict[str, Any] = {"properties": {"a": {}}, "additionalProperties": False}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (NAMED, CLOSED),
        ({"patternProperties": {"^a": {}}}, {"patternProperties": {"^a": {}}, "additionalProperties": False}),
        ({"type": "object"}, {"type": "object"}),
        ({**NAMED, "additionalProperties": True}, {**NAMED, "additionalProperties": True}),
        ({"properties": {"a": NAMED}}, {"properties": {"a": CLOSED}, "additionalProperties": False}),
        ({"anyOf": [NAMED, {"type": "integer"}]}, {"anyOf": [CLOSED, {"type": "integer"}]}),
        ({"allOf": [NAMED]}, {"allOf": [CLOSED]}),
        ({"prefixItems": [{}]}, {"prefixItems": [{}], "items": False}),
        ({"items": NAMED}, {"items": CLOSED}),
        (
            {"properties": {"c": {"$ref": "#"}}},
            {"properties": {"c": {"$ref": "#"}}, "additionalProperties": False},
        ),
    ],
)
def test_an_object_alone_with_its_instance_is_closed(
    schema: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert closed(schema) == expected


@pytest.mark.parametrize(
    "schema",
    [
        {"allOf": [NAMED, {"properties": {"b": {}}}]},
        {**NAMED, "anyOf": [{"properties": {"b": {}}}, {"required": ["a"]}]},
        {"allOf": [{"$ref": "#/$defs/p"}, {"properties": {"b": {}}}], "$defs": {"p": NAMED}},
        {"$ref": "#/$defs/q", "properties": {"z": {}}, "$defs": {"q": {"$ref": "#/$defs/r"}, "r": NAMED}},
        {"$ref": "#anchor", "properties": {"z": {}}, "$defs": {"r": {"$anchor": "anchor", **NAMED}}},
    ],
)
def test_an_object_that_shares_its_instance_is_left_open(schema: dict[str, Any]) -> None:
    assert closed(schema) == schema


def test_the_schema_given_is_not_changed() -> None:
    schema = {"properties": {"a": NAMED}}
    closed(schema)
    assert schema == {"properties": {"a": NAMED}}

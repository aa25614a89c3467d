"""The CONSTRAIN-1 shape checks: a whole text must have the shape, a text cut short a prefix of one."""

from __future__ import annotations

import pytest

from conformance.validators.shapes import Shape, shape_problem

PERSON = Shape.json_schema(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
)


@pytest.mark.parametrize(
    ("shape", "text", "complete", "ok"),
    [
        (PERSON, '{"name": "Ada", "age": 36}', True, True),
        (PERSON, '{"name": "Ada", "age": -1}', True, False),
        (PERSON, '{"name": "Ada"}', True, False),
        (PERSON, '{"name": "Ada", "ag', False, True),
        (PERSON, '{"name": "Ada"}}', False, False),
        (PERSON, '{"name": "Ad\ufffd', False, True),
        (PERSON, '{"name": "Ad\ufffd"}', True, False),
        (Shape.json_object(), "[1, 2]", True, False),
        (Shape.json_object(), "[1", False, False),
        (Shape.regex(r"[0-9]{3}-[a-z]+"), "123-abc", True, True),
        (Shape.regex(r"[0-9]{3}-[a-z]+"), "12", False, True),
        (Shape.regex(r"[0-9]{3}-[a-z]+"), "12", True, False),
        (Shape.regex(r"[0-9]{3}-[a-z]+"), "12x", False, False),
        (Shape.choice("yes", "no"), "ye", False, True),
        (Shape.choice("yes", "no"), "ye", True, False),
        (Shape.choice("yes", "no"), "maybe", False, False),
    ],
)
def test_a_text_has_the_shape_or_is_a_prefix_when_cut(
    shape: Shape, text: str, complete: bool, ok: bool
) -> None:
    assert (shape_problem(shape, text, complete=complete) is None) is ok
